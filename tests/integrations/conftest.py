"""Fixtures for the eval-framework integrations: offline hub settings, local tasks, one shared vLLM engine.

Only one vLLM engine is started per test session (start-up takes ~20 s and the engine core is a spawned
process): every end-to-end test, lm-eval's and lighteval's, uses the session's `vllm_backend`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

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
def vllm_backend(request: pytest.FixtureRequest) -> Any:
    """The session's engine on the tiny model (tests/conftest.py), shared with tests/vllm: never closed here."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    if importlib.util.find_spec("asyncbackends.adapters.vllm") is None:
        pytest.skip("the vllm adapter is not available")
    return request.getfixturevalue("tiny_vllm_engine")
