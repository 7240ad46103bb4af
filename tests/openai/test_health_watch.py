"""A vLLM server's chats are asked whole (its parsers split a streamed answer otherwise), and the idle limit
is kept by the server's ``GET /health``: against the look-alike passing for vLLM (``owned_by="vllm"``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.openai import OpenAIBackend
from asyncbackends.testing.fake_openai_stream import FakeOpenAIServer

from .conftest import Make, until

IDLE = 4.0
FAST = ab.RetryPolicy(max_attempts=3, initial_delay=0.001, max_delay=0.01)
ONCE = ab.RetryPolicy(max_attempts=1)


async def vllm_like(make: Make, **options: Any) -> tuple[FakeOpenAIServer, OpenAIBackend]:
    server, backend = await make(owned_by="vllm", **options)
    assert backend.server == "vllm"
    return server, backend


def chat(text: str, **params: Any) -> ab.GenerationRequest:
    return ab.GenerationRequest([{"role": "user", "content": text}], ab.SamplingParams(**params))


async def in_flight(
    server: FakeOpenAIServer, backend: OpenAIBackend, text: str, idle: float, **options: Any
) -> asyncio.Future[list[Any]]:
    """A run of one chat ``text`` started in the background, returned once the server holds it."""
    run = asyncio.ensure_future(
        ab.gather(backend, [chat(text, max_tokens=32)], timeout=ab.Timeouts(idle=idle), **options)
    )
    await until(lambda: server.attempts[text] == 1, timeout=60)
    return run


@pytest.mark.asyncio
async def test_chats_are_sent_whole_and_text_prompts_streamed(make: Make) -> None:
    server, backend = await vllm_like(
        make,
    )
    requests = [
        chat("a chat", max_tokens=32),
        ab.GenerationRequest("a prompt", ab.SamplingParams(max_tokens=32)),
    ]
    results = await ab.gather(backend, requests)  # the default timeouts: an idle limit applies
    assert [r.text for r in results] == ["a chat", "a prompt"]
    assert server.answers == {"whole": 1, "streamed": 1}
    assert server.health_checks == 0  # answers shorter than half the idle limit cost no probe
    # A generic server's chats are still streamed under the idle limit.
    generic = await ab.acreate_backend("openai", base_url=server.url + "/v1", api_key="k", server="generic")
    try:
        await ab.gather(generic, [chat("a chat", max_tokens=32)])
    finally:
        await generic.aclose()
    assert server.answers == {"whole": 1, "streamed": 2}


@pytest.mark.asyncio
async def test_a_whole_answer_longer_than_idle_finishes_while_the_server_answers_its_health(
    make: Make,
) -> None:
    # The answer is held until three probes were answered after it came: spaced IDLE / 2 apart, that is
    # longer than the idle limit, which would have cut it had nothing kept it.
    server, backend = await vllm_like(make, whole_after_checks=3)
    metrics = ab.RunMetrics()
    started = time.monotonic()
    run = await in_flight(server, backend, "a long thought", IDLE, metrics=metrics)
    probe = backend._health._probe
    assert probe is not None
    (result,) = await run
    assert time.monotonic() - started >= IDLE
    assert result.text == "a long thought" and server.health_checks >= 3
    assert server.attempts["a long thought"] == 1 and metrics.retries == 0
    await until(probe.done)  # the probe stops with the last answer it watched
    assert backend._health._probe is None


@pytest.mark.asyncio
async def test_a_shorter_idle_limit_joining_a_longer_one_is_probed_in_time(make: Make) -> None:
    # The probe of a 60 s limit sleeps 30 s; a watch of IDLE joining it starts it again at IDLE / 2, or
    # that watch would see no sign of life and fail (it may not retry).
    server, backend = await vllm_like(make, whole_after_checks=2)
    long_limit = await in_flight(server, backend, "a long limit", 60.0)
    (short,) = await ab.gather(
        backend, [chat("a short limit", max_tokens=32)], timeout=ab.Timeouts(idle=IDLE), retry=ONCE
    )
    (long,) = await long_limit
    assert (short.text, long.text) == ("a short limit", "a long limit")
    assert server.attempts == {"a long limit": 1, "a short limit": 1}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "timeout",
    [
        pytest.param(ab.Timeouts(idle=IDLE), id="no-sign-of-life-for-idle"),
        # The run's total cuts the attempt while it waits inside the watch.
        pytest.param(ab.Timeouts(total=3.0, idle=60.0), id="cut-by-its-total"),
    ],
)
async def test_an_attempt_on_a_frozen_server_is_retried_and_its_exchange_closed(
    make: Make, timeout: ab.Timeouts
) -> None:
    # The first attempt hangs on the server, and /health with it.
    server, backend = await vllm_like(make, sick_attempts=1)
    metrics = ab.RunMetrics()
    (result,) = await ab.gather(
        backend, [chat("a frozen server", max_tokens=32)], timeout=timeout, retry=FAST, metrics=metrics
    )
    assert result.text == "a frozen server"
    assert server.attempts["a frozen server"] == 2 and server.answers == {"whole": 1}
    assert metrics.retries == 1 and metrics.retried_errors == {"BackendTimeoutError": 1}
    await until(lambda: server._sick == 0)  # the hung exchange was closed, not left behind


@pytest.mark.asyncio
async def test_the_idle_error_names_the_health_check_and_is_retryable(make: Make) -> None:
    _server, backend = await vllm_like(make, sick_attempts=1)
    (error,) = await ab.gather(
        backend,
        [chat("a frozen server", max_tokens=32, seed=1)],
        timeout=ab.Timeouts(idle=IDLE),
        retry=ONCE,
        return_exceptions=True,
    )
    assert type(error) is ab.BackendTimeoutError and error.retryable
    assert "no sign of life from the server for 4 s" in str(error) and "GET /health" in str(error)


@pytest.mark.asyncio
async def test_closing_the_backend_ends_a_watched_answer_and_its_probe(make: Make) -> None:
    server, backend = await vllm_like(make, sick_attempts=1)
    task = await in_flight(server, backend, "closed under it", 60.0)
    probe = backend._health._probe
    assert probe is not None and not probe.done()
    await backend.aclose()
    with pytest.raises(ab.BackendClosedError):
        await task
    assert probe.done() and backend._health._probe is None  # aclose waits for the probe to stop
