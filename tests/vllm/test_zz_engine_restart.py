"""An engine core killed mid-run is started again and its requests sent again (``max_restarts``), on an engine
of this module's own (named to run last: it kills it). Three engine starts in all: the first and two restarts.

The deaths are SIGKILLs of the engine-core process found by pid, sent when the run reaches a state (a count of
results done, requests held by the engine), never after a guessed time.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab

from ..processes import engine_core_pids
from .conftest import build_backend

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

LOGGER = "asyncbackends.adapters.vllm"


@pytest.fixture(scope="module")
def restarting(tiny_model: str) -> Iterator[Any]:
    backend = build_backend(tiny_model, max_model_len=256, max_restarts=2)
    yield backend
    backend.close()


def core_pid(backend: Any) -> int:
    """The pid of the backend's engine-core process (read on the shared loop, the engine's own)."""

    async def read() -> int:
        return int(backend.engine.engine_core.resources.engine_manager.processes[0].pid)

    return ab.get_loop_manager().run(read())


def monitors() -> int:
    """vLLM's engine-monitor threads alive in this process (one per live engine)."""
    return sum(t.name == "MPClientEngineMonitor" and t.is_alive() for t in threading.enumerate())


def wait_for(predicate: Any, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout  # a safety net only: the wait is for the state
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def _tokens(results: list[Any]) -> list[tuple[int, ...]]:
    return [r.completions[0].token_ids for r in results]


# vLLM's client of a killed engine core leaves a ZeroMQ context and sockets for the garbage collector; that is
# vLLM's clean-up after a crash (the adapter destroys the context when it stops the dead engine).
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_core_killed_mid_run_is_started_again_and_500_greedy_results_equal_an_undisturbed_run(
    restarting: Any, caplog: pytest.LogCaptureFixture
) -> None:
    backend = restarting
    requests = [
        ab.GenerationRequest(f"Question {i}: what comes after {i}?", ab.SamplingParams(max_tokens=16), str(i))
        for i in range(500)
    ]
    undisturbed = ab.run_batch(backend, requests)
    assert backend.restarts == 0
    old = core_pid(backend)
    cores_before, monitors_before = set(engine_core_pids()), monitors()
    from asyncbackends.adapters.vllm._shm import engine_segments

    segments = engine_segments(backend.engine)  # the dead core cannot unlink the one it created
    assert segments, "the engine's shared memory was not found"
    state: dict[str, int] = {"done": 0}

    def kill_at_100(done: ab.RequestDone) -> None:  # runs on the shared loop, as each request ends
        state["done"] += 1
        if state["done"] == 100:
            state["held"] = backend.engine.get_num_unfinished_requests()
            os.kill(old, signal.SIGKILL)

    retried: list[ab.RetryEvent] = []
    callbacks = ab.RunCallbacks(on_request_done=kill_at_100, on_retry=retried.append)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        results = ab.run_batch(backend, requests, callbacks=callbacks)
    assert state["held"] > 0, "the kill landed after the run"
    print(f"killed with {state['held']} requests in the engine; restarts={backend.restarts}")
    assert all(isinstance(r, ab.GenerationResult) for r in results)
    assert _tokens(results) == _tokens(undisturbed)
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    assert backend.restarts == 1
    assert not retried  # the death was hidden inside the adapter: gather saw no failure
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert any("died (EngineDeadError" in m and "restart 1 of at most 2" in m for m in warned), warned
    times = [r.created for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    print(f"the restart took {times[-1] - times[0]:.1f} s (dead engine stopped, new one started)")
    # Nothing of the dead engine is left: its core is gone, one new core, the dead client's monitor ended,
    # its shared memory unlinked.
    assert not [name for name in segments if (Path("/dev/shm") / name).exists()]
    new = core_pid(backend)
    assert new != old
    assert set(engine_core_pids()) == (cores_before - {old}) | {new}
    wait_for(lambda: monitors() == monitors_before, "the dead engine's monitor thread ended", 30)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_deaths_in_a_row_past_max_restarts_fail_what_is_left_and_nothing_hangs(
    restarting: Any, caplog: pytest.LogCaptureFixture
) -> None:
    backend = restarting
    # Long generations, held by the engine across each death.
    params = ab.SamplingParams(max_tokens=200, min_tokens=200)
    requests = [ab.GenerationRequest(f"Story {i}: once upon a time", params, str(i)) for i in range(32)]
    undisturbed = ab.run_batch(backend, requests[:4])

    def held() -> int:
        async def count() -> int:
            engine = backend._engine  # the engine now (dead or alive), without the closed check
            return 0 if engine is None else int(engine.get_num_unfinished_requests())

        return ab.get_loop_manager().run(count())

    cores_before = set(engine_core_pids())
    first = core_pid(backend)
    killed: set[int] = set()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        future = ab.get_loop_manager().submit(ab.gather(backend, requests, return_exceptions=True))
        # The same requests die with each engine: the deaths come in a row, each once the new engine holds
        # the requests sent again, until the last one finds no restart left.
        for _ in range(3 - backend.restarts):
            wait_for(lambda: core_pid(backend) not in killed and held() > 0, "a new engine holding requests")
            assert not future.done()
            pid = core_pid(backend)
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        killed = time.monotonic()
        results = future.result(timeout=120)
    print(f"what was left failed {time.monotonic() - killed:.2f} s after the last kill")
    broken = [r for r in results if isinstance(r, ab.BackendBrokenError)]
    assert broken, "nothing was in flight at the last death"
    assert "after 2 restart(s) (max_restarts=2)" in str(broken[0]) and not broken[0].retryable
    done = [(i, r) for i, r in enumerate(results) if not isinstance(r, ab.BackendError)]
    assert len(done) + len(broken) == len(requests)
    for i, result in done:  # whatever finished before the last death is exact
        if i < len(undisturbed):
            assert result.completions[0].token_ids == undisturbed[i].completions[0].token_ids
    assert backend.restarts == 2
    assert any("died" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    # Given up: later requests fail at once, and closing leaves no engine process behind.
    later = ab.run_batch(backend, requests[:1], return_exceptions=True)
    assert isinstance(later[0], ab.BackendBrokenError)
    # Every engine core this test started is gone, and none is left running.
    wait_for(lambda: set(engine_core_pids()) == cores_before - {first}, "only the other engines' cores", 60)
    backend.close()
