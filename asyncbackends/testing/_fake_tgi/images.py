r"""Images in what a `FakeTGIServer` model reads: TGI's markdown form ``![](url)``, read as its router does.

TGI's router (``prepare_input`` in router/src/validation.rs) finds every ``![](...)`` in a vision model's
``inputs`` with the pattern ``!\[\]\([^\)]*\)``, on ``/generate`` as on the Messages API (whose image
chunks it renders in that form first), and reads each one: an ``http(s)`` URL is fetched, a ``data:`` URL
must be ``data:<type>;base64,<data>`` with standard base64 of a decodable image, and anything else is
refused. Each failure is a 422 validation error with the router's message (``invalid image content: ...``,
``base64 encoding is invalid: ...``, ``invalid image: ...``).

The look-alike plays a vision model: it reads the images the same way, but fetches nothing (an http(s) URL
is taken as it is) and decodes no pixels (a data URL's bytes must start as a PNG, JPEG, GIF, WebP or TIFF
file does). The model then reads each image as ``[image <16 hex>]``, the SHA-256 of its bytes (of the URL
for an http(s) image), as the mock backend names images: the deterministic echo names what it saw, and an
image counts as that many tokens, not as the length of its URL.
"""

from __future__ import annotations

import base64
import binascii
import re

from ..._chat import image_digest
from ...adapters.tgi._wire import MARKDOWN_IMAGE
from .validation import WireError

__all__ = ["image_name", "read_images"]

# The mime types TGI's router names (format_from_mimetype), and the magic numbers of those formats.
_MAGIC = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/jpg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
    "image/tiff": (b"II*\x00", b"MM\x00*"),
}
_FORMAT_NAMES = {"image/png": "Png", "image/jpeg": "Jpeg", "image/jpg": "Jpeg", "image/gif": "Gif"}
_B64_ALPHABET = re.compile(rb"[^A-Za-z0-9+/=]")


def _invalid(message: str) -> WireError:
    return WireError.json_error(422, f"Input validation error: {message}", "validation")


def image_name(url: str) -> str:
    """How the look-alike's model reads the image at ``url``: ``[image <16 hex>]``, as the mock names it."""
    return f"[image {image_digest(url)}]"


def _base64_problem(data: bytes) -> str:
    # The wording of Rust's base64 crate (DecodeError's Display), which TGI's message carries.
    bad = _B64_ALPHABET.search(data)
    if bad is not None:
        return f"Invalid symbol {data[bad.start()]}, offset {bad.start()}."
    if len(data.rstrip(b"=")) % 4 == 1:
        return "Invalid input length."
    return "Invalid padding"


def _check_data_url(markdown: str) -> None:
    """Read one ``![](data:...)`` as the router does: its 422 where the router refuses it."""
    content = markdown[len("![](data:") : -1]
    tokens = content.split(";")
    if len(tokens) != 2:
        raise _invalid(f"invalid image content: {content}")
    mimetype, payload = tokens
    if not payload.startswith("base64,"):
        raise _invalid(f"invalid image content: {payload}")
    encoded = payload[len("base64,") :].encode()
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(f"base64 encoding is invalid: {_base64_problem(encoded)}") from None
    magic = _MAGIC.get(mimetype)
    if magic is None:  # the router guesses the format from the bytes
        if not any(data.startswith(m) for known in _MAGIC.values() for m in known):
            raise _invalid("invalid image: The image format could not be determined")
    elif not data.startswith(magic):
        name = _FORMAT_NAMES.get(mimetype, mimetype.split("/")[1].capitalize())
        raise _invalid(f"invalid image: Format error decoding {name}: the bytes are not a {mimetype} file")


def read_images(inputs: str) -> str:
    """The text the model reads for ``inputs``: each markdown image as `image_name` names it.

    Raises:
        WireError: An image TGI's router would refuse, with its 422 validation error.
    """

    def read(match: re.Match[str]) -> str:
        markdown = match.group(0)
        if markdown.startswith("![](data:"):
            _check_data_url(markdown)
        elif not markdown.startswith(("![](http://", "![](https://")):
            raise _invalid(f"invalid image content: {markdown}")
        return image_name(markdown[len("![](") : -1])

    return MARKDOWN_IMAGE.sub(read, inputs)
