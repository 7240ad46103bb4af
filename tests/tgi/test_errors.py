"""Wire errors mapped to the library's, and gather's retries over them."""

from __future__ import annotations

import asyncio
import io
import socket

import aiohttp
import pytest

import asyncbackends as ab
from asyncbackends.adapters._http.transport import (
    HTTPTransport,
    error_for_status,
    error_message,
    parse_retry_after,
)
from asyncbackends.testing.fake_tgi import FakeTGIServer, Limits

from .conftest import MakeBackend, MakeServer, fast_retry

NO_RETRY = ab.RetryPolicy(max_attempts=1)


def requests(count: int) -> list[ab.GenerationRequest]:
    return [
        ab.GenerationRequest(f"prompt {i:03d}", ab.SamplingParams(max_tokens=20), request_id=str(i))
        for i in range(count)
    ]


@pytest.mark.asyncio
@pytest.mark.parametrize("failure", [429, 503, 424, 500, "drop"])
async def test_retries_keep_order(
    make_server: MakeServer, make_backend: MakeBackend, failure: int | str
) -> None:
    server = await make_server(fail_attempts=2, failure=failure, latency=0.001, jitter=0.003)
    backend = await make_backend(server.url)
    batch = requests(24)
    results = await ab.gather(backend, batch, concurrency=8, retry=fast_retry(3))
    assert [r.request_id for r in results] == [r.request_id for r in batch]
    assert [r.text for r in results] == [r.prompt for r in batch]
    assert all(server.attempts[r.prompt] == 3 for r in batch)  # type: ignore[index]


@pytest.mark.asyncio
async def test_random_failures_all_recovered(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server(
        rate_429=0.15, rate_503=0.15, rate_424=0.1, drop_rate=0.05, jitter=0.002, seed=7
    )
    backend = await make_backend(server.url)
    batch = requests(60)
    results = await ab.gather(backend, batch, concurrency=16, retry=fast_retry(12))
    assert [r.text for r in results] == [r.prompt for r in batch]
    assert sum(server.attempts.values()) > len(batch)  # failures did happen, and were retried


@pytest.mark.asyncio
async def test_a_422_for_length_is_a_context_length_error_never_retried(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(limits=Limits(max_input_tokens=8, max_total_tokens=64))
    backend = await make_backend(server.url)  # no tokenizer: the server's 422 is what refuses it
    (outcome,) = await ab.gather(
        backend,
        [ab.GenerationRequest("far too long a prompt", ab.SamplingParams(max_tokens=4), request_id="x")],
        retry=fast_retry(5),
        return_exceptions=True,
    )
    assert type(outcome) is ab.ContextLengthError and not outcome.retryable
    assert "HTTP 422" in str(outcome) and "must have less than 8 tokens" in str(outcome)
    assert outcome.request_id == "x" and outcome.backend == "tgi"
    assert server.attempts["far too long a prompt"] == 1


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("failure", "error", "retryable"),
    [
        (429, ab.RateLimitedError, True),
        (503, ab.BackendUnavailableError, True),
        (424, ab.BackendError, True),
        (500, ab.BackendError, True),
        ("drop", ab.BackendUnavailableError, True),
    ],
)
async def test_status_mapping(
    make_server: MakeServer,
    make_backend: MakeBackend,
    failure: int | str,
    error: type[ab.BackendError],
    retryable: bool,
) -> None:
    server = await make_server(fail_attempts=1, failure=failure)
    backend = await make_backend(server.url)
    (outcome,) = await ab.gather(backend, requests(1), retry=NO_RETRY, return_exceptions=True)
    assert type(outcome) is error and outcome.retryable is retryable


@pytest.mark.asyncio
async def test_retry_after_from_a_proxy(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server(fail_attempts=1, failure=429, retry_after="7")
    backend = await make_backend(server.url)
    (outcome,) = await ab.gather(backend, requests(1), retry=NO_RETRY, return_exceptions=True)
    assert isinstance(outcome, ab.RateLimitedError) and outcome.retry_after == 7.0
    assert "Model is overloaded" in str(outcome)


@pytest.mark.asyncio
async def test_overloaded_server_concurrency_limit(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(limits=Limits(max_concurrent_requests=3), latency=0.01)
    backend = await make_backend(server.url)
    batch = requests(30)
    results = await ab.gather(
        backend,
        batch,
        concurrency=10,
        retry=ab.RetryPolicy(max_attempts=50, initial_delay=0.002, max_delay=0.02),
    )
    assert [r.text for r in results] == [r.prompt for r in batch]
    assert server.statuses[429] > 0 and server.max_in_flight <= 3


@pytest.mark.asyncio
async def test_client_timeout_option(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server(fail_attempts=1, failure="hang")
    # Long enough that a loaded machine answers the second attempt within it: the first hangs for ever.
    backend = await make_backend(server.url, timeout=2.0)
    (outcome,) = await ab.gather(backend, requests(1), retry=NO_RETRY, return_exceptions=True)
    assert type(outcome) is ab.BackendTimeoutError and outcome.retryable
    (result,) = await ab.gather(backend, requests(1), retry=NO_RETRY)  # the second attempt answers
    assert result.text == "prompt 000"


@pytest.mark.asyncio
async def test_gather_timeout_retries_a_hang(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server(fail_attempts=1, failure="hang")
    backend = await make_backend(server.url)
    # Long enough that a loaded machine answers the retry within it: the first attempt hangs for ever.
    (result,) = await ab.gather(backend, requests(1), timeout=2.0, retry=fast_retry(2))
    assert result.text == "prompt 000" and server.attempts["prompt 000"] == 2


@pytest.mark.asyncio
async def test_connection_refused(make_backend: MakeBackend) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        backend = await make_backend(f"http://127.0.0.1:{port}")
        (outcome,) = await ab.gather(backend, requests(1), retry=NO_RETRY, return_exceptions=True)
    assert type(outcome) is ab.BackendUnavailableError and outcome.retryable
    assert isinstance(outcome.__cause__, aiohttp.ClientConnectionError)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("content_type", "data", "status", "fragment"),
    [
        ("text/plain", b'{"inputs": "x"}', 415, "Expected request with `Content-Type: application/json`"),
        ("application/json", b'{"inputs": ', 400, "Failed to parse the request body as JSON"),
        ("application/json", b'{"inputs": 3}', 422, "Failed to deserialize the JSON body"),
        ("application/json", b'{"inputs": "' + b"x" * 2_000_100 + b'"}', 413, "length limit exceeded"),
    ],
)
async def test_plain_text_framework_errors(
    server: FakeTGIServer, content_type: str, data: bytes, status: int, fragment: str
) -> None:
    transport = HTTPTransport(server.url, backend="tgi")
    try:
        payload = io.BytesIO(data)
        headers = {"Content-Type": content_type}
        async with transport.session.post(server.url + "/generate", data=payload, headers=headers) as resp:
            body = await resp.read()
            assert resp.status == status and resp.content_type == "text/plain"
    finally:
        await transport.aclose()
    error = error_for_status(status, body, backend="tgi", request_id="q")
    assert type(error) is ab.RequestRejectedError and fragment in str(error) and "(request q)" in str(error)
    server.schema_violations.clear()  # these bodies break the spec on purpose


def test_error_for_status_table() -> None:
    def kind(status: int) -> type[ab.BackendError]:
        return type(error_for_status(status, b"", backend="tgi"))

    assert kind(401) is ab.AuthenticationError and kind(403) is ab.AuthenticationError
    assert kind(404) is ab.RequestRejectedError and kind(422) is ab.RequestRejectedError
    assert kind(408) is ab.BackendTimeoutError
    assert kind(502) is ab.BackendUnavailableError and kind(504) is ab.BackendUnavailableError
    assert kind(424) is ab.BackendError and error_for_status(424, b"", backend="tgi").retryable


def test_error_message_formats() -> None:
    assert error_message(b'{"error": "Input validation error: x", "error_type": "validation"}') == (
        "Input validation error: x"
    )
    assert error_message(b'{"error": {"message": "openai style"}}') == "openai style"
    assert error_message(b'{"detail": "fastapi"}') == "fastapi"
    assert error_message(b"plain words") == "plain words"
    assert error_message(b"x" * 2000).endswith("...") and len(error_message(b"x" * 2000)) < 600


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0 and parse_retry_after("0.5") == 0.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == pytest.approx(10.0)
    assert (
        parse_retry_after("soon") is None
        and parse_retry_after(None) is None
        and parse_retry_after("nan") is None
    )


@pytest.mark.asyncio
async def test_session_is_loop_bound(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    await ab.gather(backend, requests(1))  # the session now lives on the shared loop
    with pytest.raises(ab.LoopError, match="another event loop"):
        await backend.generate(requests(1)[0])  # called straight from the test's own loop
    assert asyncio.get_running_loop() is not ab.get_loop_manager().loop
