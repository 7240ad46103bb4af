"""A mock that takes ``lora_modules`` as the ``vllm`` backend does: the integrations' LoRA plumbing, no engine.

``create_backend("tests.lora_mock:LoraMock", lora_modules={"name": "/dir"})`` serves those
names as the mock serves its ``adapters`` (echo prefixed ``[name] ``, scores salted) and keeps the
directories it was given in `LoraMock.lora_modules`, so a test sees what reached the backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncbackends.adapters.mock import MockBackend

NAME = "tests.lora_mock:LoraMock"
"""The registry name of `LoraMock` (a ``module:Class`` name)."""


class LoraMock(MockBackend):
    """The mock, serving the adapters of its ``lora_modules`` option by name."""

    def __init__(self, *, lora_modules: Mapping[str, str] | None = None, **options: Any) -> None:
        self.lora_modules = dict(lora_modules or {})
        super().__init__(adapters=tuple(self.lora_modules), **options)
