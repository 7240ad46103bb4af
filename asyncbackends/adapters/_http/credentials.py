"""Credentials of the HTTP adapters: where an ambient token may go, and what must stay masked.

Three rules, shared by ``tgi``, ``openai`` and ``endpoints``:

- The ambient Hugging Face token (``HF_TOKEN``, the saved ``huggingface-cli login``) is the user's key to
  their Hugging Face account: it is sent only to Hugging Face hosts over https (`is_huggingface_url`), never
  to a plain ``http://`` server or a third party's. A token passed explicitly is sent wherever it is told to.
- A header whose name suggests a credential (``Authorization``, ``X-API-Key``, ``api-key``, cookies,
  anything with *key*, *token*, *secret*, *auth*, *password*... in its name) is held in a `Secret`.
- Credentials in a URL (``http://user:key@host``) are taken out of it: the user name and password become
  an ``Authorization: Basic`` header held in a `Secret`, and only the URL without them is kept and shown.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

from ..._protocol import Secret
from ...errors import InvalidRequestError

__all__ = [
    "HUGGINGFACE_DOMAINS",
    "is_huggingface_url",
    "is_secret_header",
    "resolve_token",
    "split_headers",
    "split_url_credentials",
]

log = logging.getLogger(__name__)

#: Domains (and their subdomains) the ambient Hugging Face token may be sent to, over https only.
HUGGINGFACE_DOMAINS = ("huggingface.co", "hf.co", "huggingface.cloud", "hf.space")

_SECRET_HEADER = re.compile(r"auth|key|token|secret|passw|cookie|credential|signature|session", re.IGNORECASE)


def is_huggingface_url(url: str) -> bool:
    """Whether ``url`` is https on a Hugging Face domain (Hub, Inference Endpoints, Spaces)."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower().rstrip(".")
    except ValueError:
        return False
    if parts.scheme != "https" or not host:
        return False
    return any(host == domain or host.endswith("." + domain) for domain in HUGGINGFACE_DOMAINS)


def resolve_token(token: str | Secret | bool | None, *, url: str | None = None) -> Secret:
    """The token to send: the one given, else the ambient Hugging Face token where ``url`` allows it.

    Args:
        token: A token or `Secret` (always sent: the caller chose it), ``None`` (or ``True``) for the ambient
            token huggingface_hub finds (``HF_TOKEN``, the saved login), ``False`` (or ``""``) for none.
        url: Where requests will go. The ambient token is dropped unless it is https on a Hugging Face
            domain (`is_huggingface_url`); ``None`` means the Hugging Face API itself.
    """
    if isinstance(token, Secret):
        return token
    if token is False:
        return Secret("")
    if token is None or token is True:
        from huggingface_hub import get_token

        ambient = get_token() or ""
        if ambient and url is not None and not is_huggingface_url(url):
            log.debug("not sending the ambient Hugging Face token to %s (not https on a Hugging Face host)",
                      split_url_credentials(url)[0])  # fmt: skip
            return Secret("")
        return Secret(ambient)
    if not isinstance(token, str):
        raise InvalidRequestError(f"token must be a str, a Secret, None or False, got {type(token).__name__}")
    return Secret(token)


def is_secret_header(name: str) -> bool:
    """Whether a header's name suggests it carries a credential (``Authorization``, ``X-API-Key``...)."""
    return bool(_SECRET_HEADER.search(name))


def split_headers(headers: Mapping[str, str] | None) -> tuple[dict[str, str], dict[str, Secret]]:
    """Headers split into plain ones and credentials (`is_secret_header`), the latter held in `Secret`."""
    plain: dict[str, str] = {}
    secret: dict[str, Secret] = {}
    for name, value in (headers or {}).items():
        if is_secret_header(name):
            secret[name] = value if isinstance(value, Secret) else Secret(str(value))
        else:
            plain[name] = value
    return plain, secret


def split_url_credentials(url: str) -> tuple[str, Secret]:
    """``url`` without its ``user:password@`` part, and that part as an ``Authorization: Basic`` value.

    The `Secret` is empty when the URL carries no credentials. A URL that cannot be parsed is returned as
    it is (the caller's own check refuses it).
    """
    try:
        parts = urlsplit(url)
        if parts.username is None and parts.password is None:
            return url, Secret("")
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:
        # Never echo the raw URL: it may hold the very credentials being removed.
        raise InvalidRequestError("url cannot be parsed (its credentials, if any, are not shown)") from None
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    basic = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    stripped = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return stripped, Secret(f"Basic {basic}")
