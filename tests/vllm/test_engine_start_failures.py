"""Engine starts that fail on real vLLM engines: no engine-core process outlives the error the caller gets.

Checked at the moment the error is received, not waited for: a start that raised while an engine of its own
was still being built or torn down (an ``engines=2`` wave, an engine whose output handler did not start)
would leave an engine core alive here (on a GPU: its memory not yet free for the caller's next attempt).
"""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab

from ..processes import engine_core_pids
from .conftest import build_backend

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


def _new_engine_cores(before: set[int]) -> set[int]:
    return set(engine_core_pids()) - before


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
