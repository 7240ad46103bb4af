"""Long generations on the openai adapter, against the streaming look-alike (time scaled as in tests/tgi)."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

import asyncbackends as ab
from asyncbackends._timeouts import DEFAULT_IDLE
from asyncbackends.adapters.openai._wire import completion_payload, parse_completions

from .conftest import Make

SCALE = 1 / 200  # 20 minutes play in 6 s; the default idle (120 s) becomes 0.6 s
# A loaded CI machine (a full GC of a long pytest process, a busy core) can pause this process for more than
# 0.6 s, which a real 120 s idle limit never meets: the runs give the idle 4x room, still well under the 6 s
# the stream lasts, so only an idle limit that each token resets lets it finish (tests/tgi does the same).
IDLE_ROOM = 4
TOKEN_INTERVAL = 0.05
TOKENS = int(20 * 60 / TOKEN_INTERVAL)  # 20 minutes of tokens at one every 50 ms
FAST = ab.RetryPolicy(max_attempts=3, initial_delay=0.001, max_delay=0.01)


def prompt_of(n: int) -> str:
    return "".join(chr(ord("a") + (i * 5) % 26) for i in range(n))


@pytest.mark.asyncio
@pytest.mark.slow
@pytest.mark.parametrize("chat", [False, True])
async def test_a_20_minute_stream_finishes_under_the_default_timeouts_unretried(
    make: Make, chat: bool
) -> None:
    server, backend = await make(
        max_model_len=2 * TOKENS + 10, token_interval=TOKEN_INTERVAL, time_scale=SCALE
    )
    text = prompt_of(TOKENS)
    prompt: Any = [{"role": "user", "content": text}] if chat else text
    metrics = ab.RunMetrics()
    started = time.monotonic()
    (result,) = await ab.gather(
        backend, [ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=TOKENS))],
        timeout=ab.Timeouts(total=None, idle=DEFAULT_IDLE * SCALE * IDLE_ROOM), metrics=metrics,
    )  # fmt: skip
    assert time.monotonic() - started >= 20 * 60 * SCALE
    assert result.text == text and result.completions[0].finish_reason == "length"
    assert result.prompt_tokens == TOKENS + 1
    assert metrics.retries == 0 and server.attempts[text] == 1 and server.answers["streamed"] == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("chat", [False, True])
async def test_a_stream_that_stops_past_idle_is_retried(make: Make, chat: bool) -> None:
    server, backend = await make(
        token_interval=TOKEN_INTERVAL, time_scale=SCALE, fail_attempts=1, failure="stall", stall_after=3
    )
    text = "a stalled answer"
    prompt: Any = [{"role": "user", "content": text}] if chat else text
    metrics = ab.RunMetrics()
    # IDLE_ROOM: a loaded machine's pause must not cut the retry too (the counts below are exact).
    (result,) = await ab.gather(
        backend, [ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=40))],
        timeout=ab.Timeouts(idle=DEFAULT_IDLE * SCALE * IDLE_ROOM), retry=FAST, metrics=metrics,
    )  # fmt: skip
    assert result.text == text
    assert server.attempts[text] == 2 and server.answers["streamed"] == 1
    assert metrics.retries == 1 and metrics.retried_errors == {"BackendTimeoutError": 1}


@pytest.mark.asyncio
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize(
    "params",
    [
        ab.SamplingParams(max_tokens=5, logprobs=True),
        ab.SamplingParams(max_tokens=50, logprobs=True),  # ends with "stop"
        ab.SamplingParams(max_tokens=8, temperature=0.9, seed=4, n=3, logprobs=True),
    ],
)
async def test_streamed_results_equal_the_whole_answer(
    make: Make, chat: bool, params: ab.SamplingParams
) -> None:
    server, backend = await make()
    prompt: Any = [{"role": "user", "content": "hello there"}] if chat else "hello there"
    request = ab.GenerationRequest(prompt, params)
    (result,) = await ab.gather(backend, [request])
    payload = completion_payload(backend.model, request, vllm=False)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with aiohttp.ClientSession() as session, session.post(server.url + path, json=payload) as resp:
        whole = await resp.json()
    completions, prompt_tokens, generated, model = parse_completions(
        whole, chat=chat, logprobs=params.logprobs
    )
    assert result.completions == completions
    assert (result.prompt_tokens, result.generated_tokens, result.model) == (prompt_tokens, generated, model)
    assert server.answers == {"streamed": 1, "whole": 1}


@pytest.mark.asyncio
async def test_context_length_exceeded_is_one_unretried_error_and_the_run_goes_on(make: Make) -> None:
    server, backend = await make(max_model_len=32)
    requests = [
        ab.GenerationRequest("fits", ab.SamplingParams(max_tokens=8)),
        ab.GenerationRequest("x" * 30, ab.SamplingParams(max_tokens=8)),
        ab.GenerationRequest("fits too", ab.SamplingParams(max_tokens=8)),
    ]
    metrics = ab.RunMetrics()
    outcomes = await ab.gather(backend, requests, retry=FAST, return_exceptions=True, metrics=metrics)
    assert outcomes[0].text == "fits" and outcomes[2].text == "fits too"  # type: ignore[union-attr]
    error = outcomes[1]
    assert type(error) is ab.ContextLengthError and not error.retryable
    assert "maximum context length is 32 tokens" in str(error)
    assert server.attempts["x" * 30] == 1 and metrics.retries == 0
    assert metrics.errors == {"ContextLengthError": 1} and metrics.context_length_errors == 1
    assert "too long for the model: 1" in metrics.format()


@pytest.mark.asyncio
@pytest.mark.parametrize("chat", [False, True])
async def test_without_an_idle_limit_the_answer_is_asked_whole_and_equals_the_streamed_one(
    make: Make, chat: bool
) -> None:
    # Nothing needs the stream when no idle limit applies (a plain-number timeout is a total alone): the
    # whole answer is one body to read instead of a chunk a token.
    server, backend = await make()
    prompt: Any = [{"role": "user", "content": "hello there"}] if chat else "hello there"
    request = ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=8, logprobs=True))
    (streamed,) = await ab.gather(backend, [request])
    assert server.answers == {"streamed": 1}
    (whole,) = await ab.gather(backend, [request], timeout=30)
    assert server.answers == {"streamed": 1, "whole": 1}
    assert whole.completions == streamed.completions
    assert (whole.prompt_tokens, whole.generated_tokens) == (
        streamed.prompt_tokens,
        streamed.generated_tokens,
    )
