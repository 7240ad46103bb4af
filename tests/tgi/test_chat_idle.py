"""TGI's chats are asked whole, the idle limit kept by TGI's ``GET /health``: a frozen server is given up on.

The look-alike's ``failure="freeze"`` hangs an attempt and its ``/health`` with it, as TGI's router does when a
model shard is stuck in a step (it passes the health check on to the shards). With ``total=None`` nothing but
the idle limit can end such an attempt.
"""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab

from .conftest import MakeBackend, MakeServer, fast_retry, until

IDLE = 0.5
ONCE = ab.RetryPolicy(max_attempts=1)


def chat(text: str, **params: Any) -> ab.GenerationRequest:
    return ab.GenerationRequest(
        [{"role": "user", "content": text}], ab.SamplingParams(max_tokens=8, **params)
    )


@pytest.mark.asyncio
async def test_a_frozen_chat_ends_in_a_retryable_idle_timeout_with_no_total(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(fail_attempts=1, failure="freeze")
    backend = await make_backend(server.url)
    (error,) = await ab.gather(
        backend, [chat("a frozen server", seed=1)], timeout=ab.Timeouts(total=None, idle=IDLE), retry=ONCE,
        return_exceptions=True,
    )  # fmt: skip
    assert type(error) is ab.BackendTimeoutError and error.retryable
    assert f"no sign of life from the server for {IDLE:g} s" in str(error) and "GET /health" in str(error)
    assert server.paths["/v1/chat/completions"] == 1 and server.paths["/health"] >= 1
    await until(lambda: server.frozen == 0)  # the abandoned exchange was closed, not left on the server


@pytest.mark.asyncio
async def test_the_retry_of_a_frozen_chat_is_answered(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(fail_attempts=1, failure="freeze")
    backend = await make_backend(server.url)
    metrics = ab.RunMetrics()
    # A roomier limit than IDLE: the retry is answered at once, and a loaded machine must not cut it too.
    (result,) = await ab.gather(
        backend, [chat("a frozen server")], timeout=ab.Timeouts(total=None, idle=2.0), retry=fast_retry(2),
        metrics=metrics,
    )  # fmt: skip
    (whole,) = await ab.gather(backend, [chat("a frozen server")], timeout=None)  # asked whole, unwatched
    assert result.text == whole.text and result.text
    assert server.paths["/v1/chat/completions"] == 3 and server.answered.total() == 2
    assert metrics.retried_errors == {"BackendTimeoutError": 1}


@pytest.mark.asyncio
async def test_a_chat_slower_than_the_idle_limit_is_kept_by_the_health_checks(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    # The answer comes whole after 8 tokens at 0.5 s each, twice the idle limit: only the health checks
    # answered meanwhile keep it (a read bounded by the idle limit as a whole would cut it).
    server = await make_server(token_interval=0.5)
    backend = await make_backend(server.url)
    metrics = ab.RunMetrics()
    (result,) = await ab.gather(
        backend, [chat("abcdefgh")], timeout=ab.Timeouts(total=None, idle=2.0), metrics=metrics
    )
    assert metrics.retries == 0
    assert server.paths["/v1/chat/completions"] == 1 and server.paths["/health"] >= 2
    # No idle limit: asked whole, unwatched. Asked of a second server of its own, since a probe the first
    # run had already sent when its answer came may still reach the first server after that run returned.
    unwatched = await make_server(token_interval=0.5)
    (whole,) = await ab.gather(await make_backend(unwatched.url), [chat("abcdefgh")], timeout=None)
    assert result.text == whole.text and result.text
    assert unwatched.paths["/v1/chat/completions"] == 1 and unwatched.paths["/health"] == 0
