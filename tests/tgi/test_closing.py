"""Closed is closed: once aclose() starts, every request ends in BackendClosedError and no session survives."""

from __future__ import annotations

import asyncio

import pytest

import asyncbackends as ab
from asyncbackends.adapters.tgi import TGIBackend

from .conftest import MakeBackend, MakeServer, fast_retry, until


def generate(backend: TGIBackend, prompt: str) -> asyncio.Future[ab.GenerationResult]:
    return asyncio.ensure_future(ab.get_loop_manager().arun(backend.generate(ab.GenerationRequest(prompt))))


def assert_closed(outcome: BaseException | object) -> None:
    assert isinstance(outcome, ab.BackendClosedError), repr(outcome)
    assert not outcome.retryable


@pytest.mark.asyncio
async def test_requests_in_flight_end_closed_not_unavailable(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(fail_attempts=99, failure="hang")
    backend = await make_backend(server.url)
    calls = [generate(backend, f"p{i}") for i in range(3)]
    await until(lambda: server.in_flight == 3)
    await ab.get_loop_manager().arun(backend.aclose())
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for outcome in outcomes:
        assert_closed(outcome)
    assert backend._http._session is None


@pytest.mark.asyncio
async def test_a_request_past_the_open_check_does_not_reopen_the_session(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    # The first request reads /info (slow); the second passed its open check and waits for that read.
    # Closing then must not let the second build a new session and be answered after close.
    server = await make_server(info_latency=0.3)
    backend = await make_backend(server.url)
    first, second = generate(backend, "a"), generate(backend, "b")
    await until(lambda: server.paths["/info"] == 1)
    await ab.get_loop_manager().arun(backend.aclose())
    for outcome in await asyncio.gather(first, second, return_exceptions=True):
        assert_closed(outcome)
    assert backend._http._session is None and server.paths["/generate_stream"] == 0


@pytest.mark.asyncio
async def test_requests_waiting_for_a_connection_end_closed(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(fail_attempts=99, failure="hang")
    backend = await make_backend(server.url, max_connections=2)
    run = asyncio.ensure_future(
        ab.gather(
            backend,
            [ab.GenerationRequest(f"p{i}") for i in range(6)],
            concurrency=6,
            retry=fast_retry(5),
            return_exceptions=True,
        )
    )
    await until(lambda: server.in_flight == 2)
    await ab.get_loop_manager().arun(backend.aclose())
    for outcome in await run:
        assert_closed(outcome)
    assert server.attempts.total() == 2 and backend._http._session is None
