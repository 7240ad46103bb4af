"""An adapter vLLM cannot load fails the backend's creation (named, its engine stopped), not a request later."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import asyncbackends as ab

from ..processes import engine_core_pids
from ..tiny_engine import build_backend

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


def test_an_adapter_vllm_cannot_load_fails_the_create_and_leaves_no_engine(
    base_model: str, adapters: dict[str, str], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(adapters["alpha"], broken)
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    before = set(engine_core_pids())
    with pytest.raises(ab.InvalidRequestError, match="could not load LoRA adapter 'broken'") as raised:
        build_backend(base_model, lora_modules={"alpha": adapters["alpha"], "broken": str(broken)})
    assert str(broken) in str(raised.value)
    assert not set(engine_core_pids()) - before, "the engine that could not load the adapter is still running"
