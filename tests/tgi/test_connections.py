"""The connection pool: waiting for one of ``max_connections`` is waiting for a slot, never timed."""

from __future__ import annotations

import pytest

import asyncbackends as ab

from .conftest import MakeBackend, MakeServer

# An exchange takes LATENCY; the per-attempt TIMEOUT leaves a loaded machine 0.9 s more for one exchange,
# yet is half the 2.4 s the last pair of 16 exchanges through 2 connections waits and runs: were the wait
# for a connection timed, the last pairs would time out.
LATENCY, TIMEOUT = 0.3, 1.2


def prompts(count: int, n: int = 1) -> list[ab.GenerationRequest]:
    params = ab.SamplingParams(
        max_tokens=4, n=n, temperature=1.0 if n > 1 else 0.0, seed=1 if n > 1 else None
    )
    return [ab.GenerationRequest(f"p{i}", params) for i in range(count)]


@pytest.mark.asyncio
async def test_waiting_for_a_pooled_connection_is_not_timed(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    # 16 requests of 0.3 s through 2 connections: the last pair waits 2.1 s for a connection, longer than
    # the 1.2 s per-attempt timeout, but each one's own exchange takes 0.3 s.
    server = await make_server(latency=LATENCY)
    backend = await make_backend(server.url, max_connections=2)
    outcomes = await ab.gather(
        backend,
        prompts(16),
        concurrency=16,
        timeout=TIMEOUT,
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert [type(o).__name__ for o in outcomes] == ["GenerationResult"] * 16
    assert server.max_in_flight == 2 and server.attempts.total() == 16


@pytest.mark.asyncio
async def test_fan_out_parts_waiting_for_connections_are_not_timed(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    # n=2 fans out into two exchanges per request: 16 exchanges of 0.3 s through 2 connections.
    server = await make_server(latency=LATENCY)
    backend = await make_backend(server.url, max_connections=2)
    outcomes = await ab.gather(
        backend,
        prompts(8, n=2),
        concurrency=8,
        timeout=TIMEOUT,
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert [type(o).__name__ for o in outcomes] == ["GenerationResult"] * 8
    assert all(len(o.completions) == 2 for o in outcomes if isinstance(o, ab.GenerationResult))
    assert server.max_in_flight == 2


@pytest.mark.asyncio
async def test_an_exchange_that_holds_a_connection_too_long_still_times_out(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(latency=0.6)
    backend = await make_backend(server.url, max_connections=2)
    outcomes = await ab.gather(
        backend,
        prompts(4),
        concurrency=4,
        timeout=0.3,
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert all(isinstance(o, ab.BackendTimeoutError) for o in outcomes)
