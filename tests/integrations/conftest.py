"""Fixtures for the eval-framework integrations: offline hub settings, local tasks, one shared vLLM engine.

Only one vLLM engine is started per test session (start-up takes ~20 s and the engine core is a spawned
process): every end-to-end test, lm-eval's and lighteval's, uses the session's `vllm_backend`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab

DATA = Path(__file__).resolve().parent.parent / "data"
LM_EVAL_TASKS = DATA / "lm_eval_tasks"
LIGHTEVAL_TASKS = DATA / "lighteval_tasks"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # Local files only: an accidental hub lookup fails fast instead of waiting on the network. Per test, not
    # process-wide, so other suites that talk to look-alike hub servers are unaffected.
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    tiny_model = pytest.importorskip("asyncbackends.testing.tiny_model")
    return Path(tiny_model.build_tiny_model())


@pytest.fixture(scope="session")
def vllm_backend(tiny_model_path: Path) -> Iterator[Any]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    if importlib.util.find_spec("asyncbackends.adapters.vllm") is None:
        pytest.skip("the vllm adapter is not available")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    backend = ab.create_backend(
        "vllm",
        model=str(tiny_model_path),
        dtype="float32",
        enforce_eager=True,
        gpu_memory_utilization=0.1,
        max_model_len=512,
    )
    yield backend
    ab.get_loop_manager().run(backend.aclose())
