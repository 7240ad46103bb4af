"""An engine starting: the shared loop serves on meanwhile, and a cancelled start leaves no engine behind."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import time
import warnings
from typing import Any

import pytest

import asyncbackends as ab

from ..processes import engine_core_pids
from .conftest import ENGINE_OPTIONS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(420)]


async def _heartbeat(beats: list[float]) -> None:
    while True:
        beats.append(time.monotonic())
        await asyncio.sleep(0.05)


def test_a_starting_engine_leaves_the_loop_serving_and_a_cancelled_start_leaves_no_engine(
    tiny_model: str, backend: Any
) -> None:
    # `backend` first: the session's engine is already up, so the only engine starting here is this one.
    before = set(engine_core_pids())
    manager = ab.get_loop_manager()
    beats: list[float] = []
    beating = manager.submit(_heartbeat(beats))
    deadline = time.monotonic() + 180
    with warnings.catch_warnings():  # vLLM's own start-up warnings, as in conftest.build_backend
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        starting = manager.submit(ab.acreate_backend("vllm", model=tiny_model, **ENGINE_OPTIONS))
        while not set(engine_core_pids()) - before:
            assert not starting.done(), starting.result()
            assert time.monotonic() < deadline, "the engine core process never appeared"
            time.sleep(0.2)
        # While the engine loads, another backend's requests on the shared loop are served at once.
        sent = time.monotonic()
        echoes = ab.run_batch(ab.create_backend("mock"), [ab.GenerationRequest(f"r{i}") for i in range(50)])
        served = time.monotonic() - sent
        still_starting = not starting.done()
        cancelled_at = time.monotonic()
        assert starting.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            starting.result(timeout=10)
        # The engine goes on starting in its thread, then is shut down: its processes must all go.
        while set(engine_core_pids()) - before:
            assert time.monotonic() < deadline, "the cancelled engine's processes outlived it"
            time.sleep(0.5)
    beating.cancel()
    gaps = [b - a for a, b in itertools.pairwise(beats) if b <= cancelled_at]
    print(f"mock batch served in {served:.2f} s; largest loop stall while starting {max(gaps):.2f} s")
    assert [e.text for e in echoes] == [f"r{i}" for i in range(50)]
    assert still_starting, "the engine finished starting before the checks: they proved nothing"
    assert served < 5.0
    assert max(gaps) < 2.0  # built on the loop, the stall was the whole start-up (20-60 s here)
    # The session's engine was not disturbed.
    (ok,) = ab.run_batch(backend, [ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=2))])
    assert ok.completions[0].token_ids


def test_a_new_engine_has_paid_its_first_logprobs_request_when_create_backend_returns(
    make_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An engine's first request asking for logprobs pays a one-time cost in its engine core (seconds here;
    # later ones 0.01 s), and every loglikelihood asks for logprobs: the start pays it, with one request of
    # one token, so the first loglikelihood of a run does not (issue 53 item 14).
    with warnings.catch_warnings():  # vLLM's import-time warnings, as in conftest.build_backend
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.v1.engine.async_llm import AsyncLLM

    asked: list[Any] = []
    add_request = AsyncLLM.add_request

    async def seen(self: Any, request_id: str, prompt: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(params)
        return await add_request(self, request_id, prompt, params, *args, **kwargs)

    monkeypatch.setattr(AsyncLLM, "add_request", seen)
    backend = make_backend()
    try:
        assert [(p.max_tokens, p.logprobs) for p in asked] == [(1, 0)]
        (scored,) = ab.run_batch(backend, [ab.LoglikelihoodRequest("Paris is the capital of", " France")])
        assert scored.logprob < 0 and len(asked) == 2
    finally:
        backend.close()
