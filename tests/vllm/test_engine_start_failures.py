"""Engine starts that fail on real vLLM engines: no engine-core process outlives the error the caller gets.

Checked at the moment the error is received, not waited for: a start that raised while an engine of its own
was still being built or torn down (an ``engines=2`` wave, an engine whose output handler did not start)
would leave an engine core alive here (on a GPU: its memory not yet free for the caller's next attempt).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import asyncbackends as ab

from ..processes import engine_core_pids
from .conftest import build_backend

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


def _new_engine_cores(before: set[int]) -> set[int]:
    return set(engine_core_pids()) - before


class _SecondStartFails:
    """Wraps vLLM's engine build: the first build runs; the second waits until the first one's engine core
    process exists (that engine is being built), then raises."""

    def __init__(self, build: Any, before: set[int]) -> None:
        self.build = build
        self.before = before
        self.calls = 0
        self.lock = threading.Lock()
        self.first_was_building = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.calls += 1
            mine = self.calls
        if mine == 1:
            return self.build(*args, **kwargs)
        deadline = time.monotonic() + 300
        while not _new_engine_cores(self.before) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.first_was_building = bool(_new_engine_cores(self.before))
        raise RuntimeError("the second engine refuses to start (test)")


def test_an_engine_of_two_that_fails_to_start_leaves_no_engine_core_behind(tiny_model: str) -> None:
    from asyncbackends.adapters.vllm import _engine_lifecycle

    before = set(engine_core_pids())
    starts = _SecondStartFails(_engine_lifecycle.AsyncLLM.from_engine_args, before)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_engine_lifecycle.AsyncLLM, "from_engine_args", starts)
        with pytest.raises(ab.BackendBrokenError, match="second engine refuses") as raised:
            build_backend(tiny_model, engines=2)
        alive = _new_engine_cores(before)  # right when the error arrived: nothing may still be stopping
    assert starts.calls == 2 and starts.first_was_building, raised.value
    assert not alive, f"engine cores still alive when the start's error reached the caller: {alive}"


def test_an_engine_whose_output_handler_fails_to_start_is_stopped(tiny_model: str) -> None:
    from asyncbackends.adapters.vllm import _engine_lifecycle

    def broken(self: Any) -> None:
        raise RuntimeError("the output handler did not start (test)")

    before = set(engine_core_pids())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_engine_lifecycle.AsyncLLM, "_run_output_handler", broken)
        with pytest.raises(ab.BackendBrokenError, match="output handler did not start"):
            build_backend(tiny_model)
        alive = _new_engine_cores(before)  # the error (and the engine it names) is still held here
    assert not alive, f"the engine core outlived its failed start: {alive}"
