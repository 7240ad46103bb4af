"""Long generations on the tgi adapter: streamed, so the idle limit cuts a stall but never a long answer.

Time is scaled: the look-alike waits ``SCALE`` times its nominal pace and the client's timeouts are the
defaults scaled by the same factor, so 20 minutes of tokens play in a few seconds with the same ratios.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

import asyncbackends as ab
from asyncbackends._timeouts import DEFAULT_IDLE
from asyncbackends.adapters.tgi._wire import generate_payload, parse_generate
from asyncbackends.testing.fake_tgi import Limits

from .conftest import MakeBackend, MakeServer, fast_retry

SCALE = 1 / 200  # 20 minutes play in 6 s; the default idle (120 s) becomes 0.6 s
# A loaded CI machine (a full GC of a long pytest process, a busy core) can pause this process for more than
# 0.6 s, which a real 120 s idle limit never meets: the unretried run gives the idle 4x room, still well under
# the 6 s the stream lasts, so only an idle limit that each token resets lets it finish.
IDLE_ROOM = 4
TOKEN_INTERVAL = 0.05  # a token every 50 ms, as a reasoning model streams
TOKENS = int(20 * 60 / TOKEN_INTERVAL)  # 20 minutes' worth: 24,000 tokens
LONG = Limits(max_input_tokens=TOKENS + 10, max_total_tokens=2 * TOKENS + 20)


def prompt_of(n: int) -> str:
    # The look-alike echoes its prompt greedily: n distinct-enough characters give n generated tokens.
    return "".join(chr(ord("a") + (i * 7) % 26) for i in range(n))


@pytest.mark.asyncio
@pytest.mark.slow
async def test_a_20_minute_stream_finishes_under_the_default_timeouts_unretried(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(
        limits=LONG, token_interval=TOKEN_INTERVAL, time_scale=SCALE, check_schema=False, record=False
    )
    backend = await make_backend(server.url)
    prompt = prompt_of(TOKENS)
    metrics = ab.RunMetrics()
    defaults = ab.Timeouts()
    scaled = ab.Timeouts(total=defaults.total, idle=DEFAULT_IDLE * SCALE * IDLE_ROOM)
    assert scaled.idle is not None and 2 * scaled.idle < 20 * 60 * SCALE
    started = time.monotonic()
    (result,) = await ab.gather(
        backend, [ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=TOKENS))], timeout=scaled,
        metrics=metrics,
    )  # fmt: skip
    assert time.monotonic() - started >= 20 * 60 * SCALE  # the answer really came at the nominal pace
    (completion,) = result.completions
    assert completion.text == prompt and len(completion.token_ids) == TOKENS
    assert completion.finish_reason == "length" and result.prompt_tokens == TOKENS + 1
    assert metrics.retries == 0 and server.attempts[prompt] == 1 and metrics.successes == 1


@pytest.mark.asyncio
@pytest.mark.slow
async def test_a_total_limit_alone_would_cut_the_same_generation(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    # What a 600 s client-wide timeout does to it (inspect's, lm-eval's 300 s): cut, then sent again.
    server = await make_server(
        limits=LONG, token_interval=TOKEN_INTERVAL, time_scale=SCALE, check_schema=False, record=False
    )
    backend = await make_backend(server.url)
    prompt = prompt_of(TOKENS)
    (outcome,) = await ab.gather(
        backend, [ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=TOKENS))],
        timeout=600 * SCALE, retry=fast_retry(1), return_exceptions=True,
    )  # fmt: skip
    assert isinstance(outcome, ab.BackendTimeoutError) and "longer than" in str(outcome)


@pytest.mark.asyncio
async def test_a_stream_that_stops_past_idle_is_retried(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(
        token_interval=TOKEN_INTERVAL, time_scale=SCALE, fail_attempts=1, failure="stall", stall_after=5
    )
    backend = await make_backend(server.url)
    metrics = ab.RunMetrics()
    # IDLE_ROOM: a loaded machine's pause must not cut the retry too (the counts below are exact).
    (result,) = await ab.gather(
        backend, [ab.GenerationRequest("a stalled answer", ab.SamplingParams(max_tokens=40))],
        timeout=ab.Timeouts(idle=DEFAULT_IDLE * SCALE * IDLE_ROOM), retry=fast_retry(3), metrics=metrics,
    )  # fmt: skip
    assert result.completions[0].text == "a stalled answer"
    assert server.attempts["a stalled answer"] == 2  # the stalled one, then the one that finished
    assert metrics.retries == 1 and metrics.retried_errors == {"BackendTimeoutError": 1}


@pytest.mark.asyncio
async def test_the_idle_timeout_is_named_as_such(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server(fail_attempts=1, failure="stall", stall_after=2)
    backend = await make_backend(server.url)
    (outcome,) = await ab.gather(
        backend, [ab.GenerationRequest("stalls", ab.SamplingParams(max_tokens=8))],
        timeout=ab.Timeouts(idle=0.2), retry=fast_retry(1), return_exceptions=True,
    )  # fmt: skip
    assert isinstance(outcome, ab.BackendTimeoutError) and outcome.retryable
    assert "no data from the server for 0.2 s (the idle timeout)" in str(outcome)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "params",
    [
        ab.SamplingParams(max_tokens=8),
        ab.SamplingParams(max_tokens=64, logprobs=True),  # ends on EOS: the special token is kept
        ab.SamplingParams(max_tokens=64, stop=("lo",)),
        ab.SamplingParams(max_tokens=16, temperature=0.8, seed=3, logprobs=True),
    ],
)
async def test_streamed_results_equal_the_non_streamed_answer(
    make_server: MakeServer, make_backend: MakeBackend, params: ab.SamplingParams
) -> None:
    server = await make_server()
    backend = await make_backend(server.url)
    request = ab.GenerationRequest("hello world", params)
    (result,) = await ab.gather(backend, [request])
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.url + "/generate", json=generate_payload(request, params.seed)) as resp,
    ):
        body: Any = await resp.json()
        prompt_tokens = int(resp.headers["x-prompt-tokens"])
    assert result.completions == (parse_generate(body, params),)
    assert result.prompt_tokens == prompt_tokens
    assert server.paths["/generate_stream"] == 1


@pytest.mark.asyncio
async def test_an_error_event_mid_stream_is_mapped(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(fail_attempts=1, failure=429)
    backend = await make_backend(server.url)
    (result,) = await ab.gather(
        backend, [ab.GenerationRequest("busy", ab.SamplingParams(max_tokens=4))], retry=fast_retry(2)
    )
    assert result.completions[0].text == "busy" and server.statuses[429] == 1


@pytest.mark.asyncio
async def test_aclose_ends_a_stream_being_read(make_server: MakeServer, make_backend: MakeBackend) -> None:
    # aiohttp forgets a response's body when its connection is closed: without the transport ending the
    # read itself, a streamed answer in progress waited forever after aclose().
    server = await make_server(token_interval=1.0, record=False)  # a token a second: still streaming
    backend = await make_backend(server.url)
    request = ab.GenerationRequest("slow", ab.SamplingParams(max_tokens=2))
    task = asyncio.ensure_future(ab.get_loop_manager().arun(backend.generate(request)))
    while server.in_flight == 0 and not task.done():  # noqa: ASYNC110 (the server counts, on its loop)
        await asyncio.sleep(0.01)
    assert not task.done(), task
    await backend.aclose()
    with pytest.raises(ab.BackendClosedError):
        await asyncio.wait_for(task, 10)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "params", [ab.SamplingParams(max_tokens=8), ab.SamplingParams(max_tokens=16, logprobs=True, seed=2)]
)
async def test_without_an_idle_limit_generate_is_asked_and_equals_the_stream(
    make_server: MakeServer, make_backend: MakeBackend, params: ab.SamplingParams
) -> None:
    # Nothing needs the stream when no idle limit applies (a plain-number timeout is a total alone):
    # /generate answers with one body instead of an event a token.
    server = await make_server()
    backend = await make_backend(server.url)
    request = ab.GenerationRequest("hello world", params)
    (streamed,) = await ab.gather(backend, [request])
    assert (server.paths["/generate_stream"], server.paths["/generate"]) == (1, 0)
    (whole,) = await ab.gather(backend, [request], timeout=ab.Timeouts(total=30, idle=None))
    assert (server.paths["/generate_stream"], server.paths["/generate"]) == (1, 1)
    assert whole.completions == streamed.completions and whole.prompt_tokens == streamed.prompt_tokens
    assert whole.generated_tokens == streamed.generated_tokens
