"""Images on ``/generate`` in TGI's markdown form (``![](url)`` in a text prompt), checked by TGI's spec.

A text prompt is sent as it is: a prompt written in the model's own format with markdown images is how TGI's
docs send images to ``/generate``. The look-alike reads them as TGI's router does and names each image it saw.
"""

from __future__ import annotations

import base64
import hashlib

import pytest

import asyncbackends as ab
from asyncbackends.testing import openapi
from asyncbackends.testing.fake_tgi import FakeTGIServer, Limits

from .conftest import MakeBackend, MakeServer, noise_png, png, sent

URL = "https://example.com/cat.png"  # taken as it is: the look-alike fetches nothing


def _data_url(data: bytes) -> str:
    return ab.image_part(data)["image_url"]["url"]


def _seen(data: bytes) -> str:
    # What the look-alike's model reads for an image: the SHA-256 of its bytes (of the URL for an http one).
    return f"[image {hashlib.sha256(data).hexdigest()[:16]}]"


@pytest.mark.asyncio
async def test_markdown_images_go_to_generate_as_they_are(
    server: FakeTGIServer, make_backend: MakeBackend
) -> None:
    backend = await make_backend(server.url)
    picture = png()
    prompt = f"User:![]({_data_url(picture)})![]({URL})What are these?\nAssistant:"
    read = f"User:{_seen(picture)}{_seen(URL.encode())}What are these?\nAssistant:"
    params = ab.SamplingParams(max_tokens=len(read) + 1)  # room for the whole echo and EOS
    (result,) = await ab.gather(backend, [ab.GenerationRequest(prompt, params)])
    (body,) = sent(server)
    assert body["inputs"] == prompt
    assert openapi.schema_errors("/components/schemas/GenerateRequest", body) == []
    # The greedy echo names both images; each counted as its name's tokens, not as its URL's length.
    assert result.text == read and result.prompt_tokens == len(read) + 1
    assert server.schema_violations == []


@pytest.mark.asyncio
async def test_both_routes_name_the_same_image(server: FakeTGIServer, make_backend: MakeBackend) -> None:
    # The Messages API renders an image chunk in the markdown form, then reads it as /generate does.
    backend = await make_backend(server.url)
    picture = png(3)
    params = ab.SamplingParams(max_tokens=64)
    chat = [{"role": "user", "content": [ab.image_part(picture)]}]
    text = f"![]({_data_url(picture)})"
    on_chat, on_generate = await ab.gather(
        backend, [ab.GenerationRequest(chat, params), ab.GenerationRequest(text, params)]
    )
    assert _seen(picture) in on_chat.text and on_generate.text == _seen(picture)


@pytest.mark.asyncio
async def test_an_oversized_markdown_image_is_refused_before_sending(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server()
    backend = await make_backend(server.url)
    prompt = f"![]({_data_url(noise_png(900))})Describe it."  # about 2.4 MB: over TGI's 2,000,000 bytes
    request = ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=4))
    with pytest.raises(ab.RequestRejectedError, match="payload limit"):
        await ab.gather(backend, [request])
    assert server.paths["/generate_stream"] == 0  # nothing sent
    # Sent anyway (the check off), the look-alike counts the image's bytes as TGI does: axum's 413.
    unchecked = await make_backend(server.url, payload_limit=None)
    with pytest.raises(ab.RequestRejectedError, match="length limit exceeded"):
        await ab.gather(unchecked, [request], retry=ab.RetryPolicy(max_attempts=1))
    assert server.statuses[413] == 1
    # Under the limit, a large image is read and answered.
    fits = ab.GenerationRequest(f"![]({_data_url(noise_png(400))})", ab.SamplingParams(max_tokens=30))
    (result,) = await ab.gather(backend, [fits])
    assert result.text.startswith("[image ")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("data:image/png;base64,iVBO@@@=", "base64 encoding is invalid: Invalid symbol 64, offset 4."),
        ("data:image/png,iVBORw0KGgo=", "invalid image content: image/png,iVBORw0KGgo="),
        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "invalid image: "),
        (
            "data:text/plain;base64," + base64.b64encode(b"hello").decode(),
            "invalid image: The image format could not be determined",
        ),
        ("file:///etc/passwd", "invalid image content: ![](file:///etc/passwd)"),
    ],
)
async def test_an_image_tgi_cannot_read_is_its_422(
    server: FakeTGIServer, make_backend: MakeBackend, image: str, message: str
) -> None:
    backend = await make_backend(server.url)
    request = ab.GenerationRequest(f"Look: ![]({image})", ab.SamplingParams(max_tokens=4), request_id="bad")
    (error,) = await ab.gather(backend, [request], return_exceptions=True)
    assert isinstance(error, ab.RequestRejectedError) and not error.retryable
    assert error.request_id == "bad" and f"Input validation error: {message}" in str(error)
    assert server.statuses[422] == 1 and server.paths["/generate_stream"] == 1  # answered once, never retried
    assert server.schema_violations == []  # the 422 is TGI's ErrorResponse, by the spec


@pytest.mark.asyncio
async def test_a_tokenizer_counts_the_text_around_images(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(limits=Limits(max_input_tokens=100, max_total_tokens=120))
    # A character tokenizer: the image's data URL alone is far over 100 characters.
    backend = await make_backend(server.url, tokenizer=lambda text: list(range(len(text))))
    image = f"![]({_data_url(png(8))})"
    assert len(image) > 120
    (answered,) = await ab.gather(
        backend, [ab.GenerationRequest(image + "Hi", ab.SamplingParams(max_tokens=4))]
    )
    assert answered.text
    # The text around the images is still counted, as a lower bound (TGI adds the image tokens).
    long_text = ab.GenerationRequest(image + "x" * 101, ab.SamplingParams(max_tokens=4))
    with pytest.raises(ab.RequestRejectedError, match="at least 101 tokens"):
        await ab.gather(backend, [long_text])
    assert server.paths["/generate_stream"] == 1
