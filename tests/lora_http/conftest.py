"""Shared bits of the LoRA tests on the HTTP adapters: a local peft-shaped adapter directory (no weights needed
by the look-alikes, which read only ``adapter_config.json``; the ``openai`` adapter digests every file)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

MakeAdapter = Callable[[str], str]


@pytest.fixture
def make_adapter(tmp_path: Path) -> MakeAdapter:
    """``make_adapter(name)``: a directory with an ``adapter_config.json`` and a weights file of its own."""

    def make(name: str, weights: bytes | None = None) -> str:
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        (directory / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
        (directory / "adapter_model.safetensors").write_bytes(weights or name.encode())
        return str(directory)

    return make
