"""Credentials: the ambient Hugging Face token goes to Hugging Face over https only; every credential is masked."""

from __future__ import annotations

import base64
import json
import logging

import pytest

import asyncbackends as ab
from asyncbackends._cache import backend_fingerprint
from asyncbackends.adapters._http.credentials import is_huggingface_url, is_secret_header
from asyncbackends.adapters.tgi import TGIBackend
from asyncbackends.testing.fake_tgi import FakeTGIServer, Limits

from .conftest import MakeBackend, MakeServer

AMBIENT = "hf_AMBIENTsecret_246"


@pytest.mark.parametrize(
    ("url", "sent"),
    [
        ("https://abc123.us-east-1.aws.endpoints.huggingface.cloud", True),
        ("https://router.huggingface.co/v1", True),
        ("https://huggingface.co", True),
        ("https://someone-space.hf.space", True),
        ("http://abc123.us-east-1.aws.endpoints.huggingface.cloud", False),  # plain http
        ("https://huggingface.co.evil.example", False),
        ("https://evilhuggingface.co", False),
        ("https://127.0.0.1:8080", False),
        ("http://localhost:8080", False),
    ],
)
def test_ambient_token_goes_to_huggingface_over_https_only(
    monkeypatch: pytest.MonkeyPatch, url: str, sent: bool
) -> None:
    monkeypatch.setenv("HF_TOKEN", AMBIENT)
    ambient = TGIBackend(url=url)
    explicit = TGIBackend(url=url, token="hf_EXPLICIT")
    assert ambient._http._auth_header.get_secret_value() == (f"Bearer {AMBIENT}" if sent else "")
    assert explicit._http._auth_header.get_secret_value() == "Bearer hf_EXPLICIT"  # the user's choice
    assert is_huggingface_url(url) is sent


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("X-API-Key", True),
        ("api-key", True),
        ("Ocp-Apim-Subscription-Key", True),
        ("X-Auth-Token", True),
        ("Proxy-Authorization", True),
        ("Cookie", True),
        ("X-Client-Secret", True),
        ("X-Scale-Up-Timeout", False),
        ("X-Request-Id", False),
        ("Content-Type", False),
    ],
)
def test_secret_header_names(name: str, secret: bool) -> None:
    assert is_secret_header(name) is secret


def shown(backend: TGIBackend, caplog: pytest.LogCaptureFixture, outcomes: list[object]) -> str:
    views = [repr(backend), str(backend), repr(vars(backend)), repr(vars(backend._http)), caplog.text]
    views.append(json.dumps(backend_fingerprint(backend), default=str))
    views += [f"{o!s} {o!r}" for o in outcomes]
    return "\n".join(views)


@pytest.mark.asyncio
async def test_credential_headers_are_sent_and_never_shown(
    make_server: MakeServer, make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server = await make_server(limits=Limits(max_input_tokens=4, max_total_tokens=8))
    headers = {"X-API-Key": "key-SECRET-1", "api-key": "key-SECRET-2", "X-Gateway-Token": "key-SECRET-3"}
    backend = await make_backend(server.url, headers={**headers, "X-Plain": "visible"})
    outcomes = await ab.gather(
        backend,
        [ab.GenerationRequest("ok", ab.SamplingParams(max_tokens=2)), ab.GenerationRequest("far too long")],
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], ab.GenerationResult) and isinstance(outcomes[1], ab.RequestRejectedError)
    seen = server.headers_received[-1]
    assert {k: seen[k] for k in headers} == headers and seen["X-Plain"] == "visible"
    text = shown(backend, caplog, outcomes)
    assert "SECRET" not in text and "visible" in repr(vars(backend._http))


@pytest.mark.asyncio
async def test_url_credentials_are_sent_as_basic_auth_and_never_shown(
    server: FakeTGIServer, make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = server.url.replace("http://", "http://alice:pw-SECRET@")
    backend = await make_backend(url, token=False)
    outcomes = await ab.gather(backend, [ab.GenerationRequest("ok", ab.SamplingParams(max_tokens=2))])
    expected = "Basic " + base64.b64encode(b"alice:pw-SECRET").decode()
    assert server.authorization == {expected: 1}
    assert backend.url == server.url
    assert "SECRET" not in shown(backend, caplog, list(outcomes)) and "alice" not in repr(vars(backend))


@pytest.mark.asyncio
async def test_url_credentials_never_show_in_connection_errors(
    make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    backend = await make_backend("http://bob:pw-SECRET@127.0.0.1:9/", token=False)
    outcomes = await ab.gather(
        backend, [ab.GenerationRequest("ok")], retry=ab.RetryPolicy(max_attempts=1), return_exceptions=True
    )
    assert isinstance(outcomes[0], ab.BackendUnavailableError)
    assert "SECRET" not in shown(backend, caplog, list(outcomes))
    with pytest.raises(ab.InvalidRequestError) as refused:
        TGIBackend(url="ftp://carol:pw-SECRET@example.com")
    assert "SECRET" not in str(refused.value)
