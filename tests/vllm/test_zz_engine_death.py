"""A dead engine core that is not started again (``max_restarts=0``) and a closed backend, on an engine of
their own (named to run last: it is slow)."""

from __future__ import annotations

import gc
import os
import signal
import time
from typing import Any

import pytest

import asyncbackends as ab

from ..processes import engine_core_pids

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]


async def _unfinished(backend: Any) -> int:
    return backend.engine.get_num_unfinished_requests()  # type: ignore[no-any-return]


def wait_until_in_engine(backend: Any, count: int, timeout: float = 120.0) -> None:
    """Block until the engine holds ``count`` unfinished requests (a safety-net timeout only)."""
    deadline = time.monotonic() + timeout
    while ab.get_loop_manager().run(_unfinished(backend)) < count:
        assert time.monotonic() < deadline, "the requests never reached the engine"
        time.sleep(0.02)


# A killed engine leaves vLLM's client with a ZeroMQ context it never closes; its finaliser warns when the
# garbage collector finds it. That is vLLM's clean-up after a crash, not something the adapter holds.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_killed_engine_fails_pending_requests_then_close(make_backend: Any, backend: Any) -> None:
    before = set(engine_core_pids())
    doomed = make_backend(max_model_len=256, max_restarts=0)  # a death is final here
    try:
        pids = [pid for pid in engine_core_pids() if pid not in before]
        assert pids, "the new engine's core process was not found"
        # One request first: vLLM asks the engine core once, on the first request, which tasks it supports;
        # asked of a stopped core, that question would never be answered.
        ab.run_batch(doomed, [ab.GenerationRequest("warm", ab.SamplingParams(max_tokens=1))])
        # A stopped engine core cannot finish anything: the requests are pending by construction when it is
        # killed, however fast or slow the machine is.
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        requests = [
            ab.GenerationRequest(f"Once upon a time {i}", ab.SamplingParams(max_tokens=240)) for i in range(8)
        ]
        future = ab.get_loop_manager().submit(ab.gather(doomed, requests, return_exceptions=True))
        wait_until_in_engine(doomed, len(requests))
        assert not future.done()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        results = future.result(timeout=60)
        elapsed = time.monotonic() - killed
        print(f"pending requests failed {elapsed:.2f} s after the engine core was killed")
        assert elapsed < 30, f"pending requests took {elapsed:.1f} s to fail"
        assert all(isinstance(r, ab.BackendBrokenError) for r in results), results
        assert not results[0].retryable
        later = ab.run_batch(doomed, requests[:1], return_exceptions=True)
        assert isinstance(later[0], ab.BackendBrokenError)
    finally:
        doomed.close()
    closed = ab.run_batch(doomed, requests[:1], return_exceptions=True)
    assert isinstance(closed[0], ab.BackendClosedError)
    with pytest.raises(ab.BackendClosedError):
        _ = doomed.engine
    del doomed, future
    gc.collect()  # collect the dead engine's leftovers here, under this test's warning filters
    # The session's engine is another process and was not affected, and the shared loop serves on.
    (ok,) = ab.run_batch(backend, [ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=2))])
    assert ok.completions[0].token_ids
    (echo,) = ab.run_batch(ab.create_backend("mock"), [ab.GenerationRequest("still serving")])
    assert echo.text == "still serving"
