"""``engines=2`` on real vLLM engines (the tiny model): both started at once, work split, answers as one
engine, memory split, a killed engine started again, a dead engine's requests served by the other. Named to
run after the session engine's tests: it kills one of its own engines at the end (three engine starts).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import asyncbackends as ab

from .conftest import build_backend

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

EOS = 1  # the tiny tokenizer's </s>
COPIES = 8  # each reference prompt sent this many times: enough requests in flight for both engines


def _strip_eos(ids: tuple[int, ...] | list[int]) -> list[int]:
    ids = list(ids)
    return ids[: ids.index(EOS)] if EOS in ids else ids


class _Starts:
    """Wraps vLLM's engine build: notes each start and end, and lets no start finish before both began.

    On a CPU vLLM spawns the engine core and is given the KV cache size, so `start_waves` puts the two eager
    engines in one wave: their builds overlap. Were they started one after another, the first
    would wait at the barrier for a second that cannot begin, and the engines' start would fail.
    """

    def __init__(self, build: Any) -> None:
        self.build = build
        self.both_began = threading.Barrier(2, timeout=300)
        self.events: list[str] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.events.append("began")
        self.both_began.wait()
        try:
            return self.build(*args, **kwargs)
        finally:
            self.events.append("ended")


_STARTED: dict[str, Any] = {}  # what the engines' start left: the events, torch's threads before and after


@pytest.fixture(scope="module")
def engines2(tiny_model: str) -> Iterator[Any]:
    import torch

    from asyncbackends.adapters.vllm import _checks as _vllm_checks
    from asyncbackends.adapters.vllm import _engine_lifecycle as _vllm_engine

    threads = torch.get_num_threads()
    on_cpu = _vllm_checks._on_cpu()  # on a GPU the engines start one after another: no barrier there
    starts = _Starts(_vllm_engine.AsyncLLM.from_engine_args)
    with pytest.MonkeyPatch.context() as patch:
        if on_cpu:
            patch.setattr(_vllm_engine.AsyncLLM, "from_engine_args", starts)
        backend = build_backend(tiny_model, engines=2)
    _STARTED.update(events=starts.events, threads=(threads, torch.get_num_threads()), on_cpu=on_cpu)
    yield backend
    backend.close()


def test_the_two_engines_started_at_once_and_left_torchs_threads_as_they_were(engines2: Any) -> None:
    assert engines2.engines  # built (the record below is the fixture's)
    if not _STARTED["on_cpu"]:
        pytest.skip("engines start together on a CPU only")
    assert _STARTED["events"] == ["began", "began", "ended", "ended"]
    before, after = _STARTED["threads"]
    assert after == before


def _requests(prompts: list[list[int]], max_tokens: int) -> list[ab.GenerationRequest]:
    return [
        ab.GenerationRequest(ids, ab.SamplingParams(max_tokens=max_tokens), request_id=f"{i}-{copy}")
        for copy in range(COPIES)
        for i, ids in enumerate(prompts)
    ]


def test_two_engines_share_the_work_and_answer_greedy_requests_as_one_engine(
    engines2: Any,
    reference_prompts: list[list[int]],
    offline_greedy: list[list[int]],
    reference_max_tokens: int,
) -> None:
    assert [s.label for s in engines2.replica_stats()] == ["engine-0", "engine-1"]
    results = ab.run_batch(engines2, _requests(reference_prompts, reference_max_tokens))
    expected = [_strip_eos(ids) for ids in offline_greedy] * COPIES
    assert [_strip_eos(r.completions[0].token_ids) for r in results] == expected
    served = {s.label: s.requests for s in engines2.replica_stats()}
    assert all(count > 0 for count in served.values()), served
    assert sum(served.values()) == len(results)


def test_a_questions_choices_meet_one_engine_in_one_request_and_questions_spread(
    engines2: Any, hf_tokenizer: Any
) -> None:
    # Issue 41 through engines=N under its default least-loaded routing: each question's one-token choices go
    # to the engine already holding their context (the router's sibling rule), where they are one request.
    from .test_scoring_paths import _check, _one_token

    contexts = [f"Question {i}: which city is the capital of France? Answer:" for i in range(6)]
    pairs = []
    for context in contexts:
        pairs += [(context, c) for c in _one_token(hf_tokenizer, context, [" A", " B", " C", " D", " 1"], 4)]
    engines = [engine._scoring for engine in engines2.engines]
    before = [scoring.groups.sent for scoring in engines]
    results = ab.run_batch(engines2, [ab.LoglikelihoodRequest(c, x) for c, x in pairs])
    sent = [scoring.groups.sent - b for scoring, b in zip(engines, before, strict=True)]
    assert sum(sent) == len(contexts), sent  # one engine request per question, none split
    assert all(count > 0 for count in sent), sent  # the questions spread over both engines
    _check(engines2.engines[0], hf_tokenizer, pairs, results)


def test_the_memory_settings_are_the_total_split_between_the_engines(engines2: Any) -> None:
    # The suite sets VLLM_CPU_KVCACHE_SPACE=1 (GiB) and gpu_memory_utilization=0.1: each engine half of it.
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"  # restored after the engines started
    for engine in engines2.engines:
        cache = engine.engine.vllm_config.cache_config
        assert cache.kv_cache_memory_bytes == (1 << 30) // 2
        assert cache.gpu_memory_utilization == pytest.approx(0.05)
    assert engines2.fingerprint == engines2.engines[0].fingerprint
    assert engines2.fingerprint["name"] == "vllm"


def _unfinished(engine: Any) -> int:
    async def count() -> int:
        return engine.engine.get_num_unfinished_requests()  # type: ignore[no-any-return]

    return ab.get_loop_manager().run(count())


def _kill_when_it_holds_requests(doomed: Any, engines2: Any, requests: list[ab.GenerationRequest]) -> Any:
    """Run ``requests`` on the pool with ``doomed``'s engine core stopped; kill the core once it holds some.

    A stopped engine core finishes nothing: requests routed to it are pending by construction when it dies.
    """
    core = doomed.engine.engine_core.resources.engine_manager.processes[0]
    os.kill(core.pid, signal.SIGSTOP)
    future = ab.get_loop_manager().submit(ab.gather(engines2, requests))
    deadline = time.monotonic() + 120  # a safety net only: the wait is for the state below
    while _unfinished(doomed) == 0:
        assert time.monotonic() < deadline, f"no request reached {doomed!r}"
        time.sleep(0.02)
    os.kill(core.pid, signal.SIGKILL)
    return future


# A killed engine leaves vLLM's client with a ZeroMQ context it never closes; its finaliser warns when the
# garbage collector finds it. That is vLLM's clean-up after a crash, not something the adapter holds.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_killed_engine_is_started_again_and_its_requests_answered_by_it(
    engines2: Any,
    reference_prompts: list[list[int]],
    offline_greedy: list[list[int]],
    reference_max_tokens: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    doomed = engines2.engines[0]
    before = {s.label: s for s in engines2.replica_stats()}
    with caplog.at_level(logging.WARNING, logger="asyncbackends.adapters.vllm"):
        future = _kill_when_it_holds_requests(
            doomed, engines2, _requests(reference_prompts, reference_max_tokens)
        )
        results = future.result(timeout=600)
    expected = [_strip_eos(ids) for ids in offline_greedy] * COPIES
    assert [_strip_eos(r.completions[0].token_ids) for r in results] == expected
    assert (doomed.restarts, engines2.engines[1].restarts, engines2.restarts) == (1, 0, 1)
    stats = {s.label: s for s in engines2.replica_stats()}
    # The death was hidden inside engine-0: the pool saw no failure, and engine-0 answered its requests.
    assert stats["engine-0"].failures == before["engine-0"].failures
    assert stats["engine-0"].successes > before["engine-0"].successes
    assert any("vllm engine-0 died" in r.getMessage() for r in caplog.records)


# A killed engine leaves vLLM's client with a ZeroMQ context it never closes; its finaliser warns when the
# garbage collector finds it. That is vLLM's clean-up after a crash, not something the adapter holds.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_dead_engines_requests_are_answered_by_the_other(
    engines2: Any,
    reference_prompts: list[list[int]],
    offline_greedy: list[list[int]],
    reference_max_tokens: int,
) -> None:
    doomed = engines2.engines[0]
    doomed._restarts.max_restarts = doomed.restarts  # no restart left: this death is final
    before = {s.label: s.successes for s in engines2.replica_stats()}
    future = _kill_when_it_holds_requests(
        doomed, engines2, _requests(reference_prompts, reference_max_tokens)
    )
    results = future.result(timeout=240)
    expected = [_strip_eos(ids) for ids in offline_greedy] * COPIES
    assert [_strip_eos(r.completions[0].token_ids) for r in results] == expected
    stats = {s.label: s for s in engines2.replica_stats()}
    assert stats["engine-0"].failures >= 1
    assert stats["engine-1"].successes - before["engine-1"] == len(results)
