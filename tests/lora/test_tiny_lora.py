"""`build_tiny_lora`: a random non-zero LoRA for the tiny model, cached by what shapes it (no engine)."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

from asyncbackends.testing.tiny_model import build_tiny_lora, build_tiny_model

TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def _tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def test_the_adapter_is_a_peft_lora_on_every_projection_with_non_zero_a_and_b(tmp_path: Path) -> None:
    base = build_tiny_model()
    adapter = build_tiny_lora(base, rank=4, seed=3, path=tmp_path / "lora")
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    assert set(config["target_modules"]) == TARGETS
    assert config["base_model_name_or_path"] == str(base.resolve())
    tensors = _tensors(adapter)
    layers = json.loads((base / "config.json").read_text())["num_hidden_layers"]
    assert len(tensors) == 2 * len(TARGETS) * layers  # an A and a B for each projection of each layer
    for name, tensor in tensors.items():
        assert 4 in tensor.shape, name
        assert tensor.abs().min() > 0, f"{name} holds zeros"  # B too: the adapter changes outputs


def test_the_same_seed_is_the_same_adapter_and_another_seed_another(tmp_path: Path) -> None:
    base = build_tiny_model()
    one = _tensors(build_tiny_lora(base, seed=0, path=tmp_path / "a"))
    again = _tensors(build_tiny_lora(base, seed=0, path=tmp_path / "b"))
    other = _tensors(build_tiny_lora(base, seed=1, path=tmp_path / "c"))
    assert one.keys() == again.keys() == other.keys()
    assert all(one[k].equal(again[k]) for k in one)
    assert not any(one[k].equal(other[k]) for k in one)


def test_the_cache_folder_is_named_after_the_base_rank_and_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCBACKENDS_CACHE_DIR", str(tmp_path))
    base = build_tiny_model()
    first = build_tiny_lora(base, rank=8, seed=0)
    assert first.parent == tmp_path and first.name.startswith("tiny-lora-")
    stamp = (first / "adapter_model.safetensors").stat().st_mtime_ns
    assert build_tiny_lora(base, rank=8, seed=0) == first  # built once
    assert (first / "adapter_model.safetensors").stat().st_mtime_ns == stamp
    assert len({first, build_tiny_lora(base, rank=8, seed=1), build_tiny_lora(base, rank=16, seed=0)}) == 3


def test_a_base_without_a_config_and_a_bad_rank_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        build_tiny_lora(tmp_path)
    with pytest.raises(ValueError, match="rank"):
        build_tiny_lora(build_tiny_model(), rank=0)


def test_without_peft_the_error_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_peft(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "peft" or name.startswith("peft."):
            raise ImportError("No module named 'peft'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peft)
    with pytest.raises(ImportError, match="pip install peft"):
        build_tiny_lora(build_tiny_model())
