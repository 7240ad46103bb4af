"""The ``lora_modules`` option checked and turned into engine arguments, without an engine."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

import asyncbackends as ab
from asyncbackends.adapters._lora_dirs import LoraModules, read_lora_modules
from asyncbackends.adapters.vllm._lora import lora_engine_options

from .conftest import ADAPTER_SEEDS


def _adapter(directory: Path, rank: int, **extra: object) -> str:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": rank, **extra}))
    (directory / "adapter_model.safetensors").write_bytes(b"weights")
    return str(directory)


def test_ids_follow_the_sorted_names_whatever_the_order_given(tmp_path: Path) -> None:
    paths = {name: _adapter(tmp_path / name, 8) for name in ("zeta", "alpha", "mu")}
    one = read_lora_modules(paths)
    other = read_lora_modules(dict(reversed(paths.items())))
    assert one is not None and other is not None
    ids = {name: module.lora_id for name, module in one.by_name.items()}
    assert ids == {"alpha": 1, "mu": 2, "zeta": 3}
    assert ids == {name: module.lora_id for name, module in other.by_name.items()}


def test_max_lora_rank_is_the_largest_rank_rounded_up_to_one_vllm_takes(tmp_path: Path) -> None:
    modules = read_lora_modules(
        {"a": _adapter(tmp_path / "a", 4), "b": _adapter(tmp_path / "b", 12, rank_pattern={"q_proj": 2})}
    )
    options = lora_engine_options(modules, {"dtype": "float32"}, on_cpu=False)
    assert options == {"dtype": "float32", "enable_lora": True, "max_lora_rank": 16, "max_loras": 2}
    # A rank_pattern entry above r counts too.
    wide = read_lora_modules({"c": _adapter(tmp_path / "c", 8, rank_pattern={"o_proj": 40})})
    assert lora_engine_options(wide, {}, on_cpu=False)["max_lora_rank"] == 64
    # Given ones stay; no modules: nothing is added.
    given = lora_engine_options(modules, {"max_lora_rank": 32, "max_loras": 1}, on_cpu=False)
    assert (given["max_lora_rank"], given["max_loras"]) == (32, 1)
    assert lora_engine_options(None, {"seed": 1}, on_cpu=True) == {"seed": 1}


def test_on_a_cpu_one_slot_is_kept_spare(tmp_path: Path) -> None:
    modules = read_lora_modules({n: _adapter(tmp_path / n, 8) for n in ("a", "b")})
    assert lora_engine_options(modules, {}, on_cpu=True)["max_loras"] == 3
    assert lora_engine_options(modules, {"max_loras": 5}, on_cpu=True)["max_loras"] == 5
    with pytest.raises(ab.InvalidRequestError, match=r"max_loras must be at least .* \(3\), got 2"):
        lora_engine_options(modules, {"max_loras": 2}, on_cpu=True)


def test_on_a_cpu_lora_targets_the_modules_the_adapters_train_unless_that_is_not_known(
    tmp_path: Path,
) -> None:
    # vLLM's CPU LoRA logits kernel (the lm_head's) fails on prompt logprobs in a batch: left unwrapped
    # where no adapter trains the lm_head, so prompt logprobs are asked in batches (the scoring tests).
    folders = itertools.count()

    def modules(*configs: dict[str, object]) -> LoraModules | None:
        return read_lora_modules(
            {f"m{i}": _adapter(tmp_path / str(next(folders)), 8, **c) for i, c in enumerate(configs)}
        )

    qv, o = {"target_modules": ["v_proj", "q_proj"]}, {"target_modules": ["o_proj"]}
    both = modules(qv, o)
    assert lora_engine_options(both, {}, on_cpu=True)["lora_target_modules"] == ["o_proj", "q_proj", "v_proj"]
    assert "lora_target_modules" not in lora_engine_options(both, {}, on_cpu=False)
    given = lora_engine_options(both, {"lora_target_modules": ["q_proj", "lm_head"]}, on_cpu=True)
    assert given["lora_target_modules"] == ["q_proj", "lm_head"]
    unknown: list[dict[str, object]] = [
        {"target_modules": "all-linear"},  # peft's own shorthand / a regex: not vLLM's names
        {"target_modules": ["model.layers.0.self_attn.q_proj"]},  # a path: vLLM's module paths differ
        {"target_modules": ["q_proj", "lm_head"]},
        {"target_modules": ["q_proj"], "modules_to_save": ["lm_head"]},
        {},
    ]
    for config in unknown:
        assert "lora_target_modules" not in lora_engine_options(modules(qv, config), {}, on_cpu=True), config


def test_bad_options_are_refused_with_what_to_do(tmp_path: Path) -> None:
    good = _adapter(tmp_path / "good", 16)
    cases = [
        ({}, "non-empty mapping"),
        (["a"], "non-empty mapping"),
        ({"": good}, "non-empty str"),
        ({"a": 3}, "directory path"),
        ({"a": str(tmp_path / "missing")}, "no such adapter directory"),
        ({"a": str(tmp_path)}, "no adapter_config.json"),
    ]
    for lora_modules, message in cases:
        with pytest.raises(ab.InvalidRequestError, match=message):
            read_lora_modules(lora_modules)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "adapter_config.json").write_text('{"r": "eight"}')
    with pytest.raises(ab.InvalidRequestError, match="positive int rank"):
        read_lora_modules({"a": str(tmp_path / "bad")})
    modules = read_lora_modules({"a": good})
    with pytest.raises(ab.InvalidRequestError, match="needs enable_lora=True"):
        lora_engine_options(modules, {"enable_lora": False}, on_cpu=False)
    with pytest.raises(
        ab.InvalidRequestError, match=r"max_lora_rank=8 is below the rank of adapter 'a' \(16\)"
    ):
        lora_engine_options(modules, {"max_lora_rank": 8}, on_cpu=False)
    huge = read_lora_modules({"h": _adapter(tmp_path / "h", 1024)})
    with pytest.raises(ab.InvalidRequestError, match="above vLLM's largest"):
        lora_engine_options(huge, {}, on_cpu=False)


def test_the_fingerprint_is_the_files_bytes_not_their_place(tmp_path: Path) -> None:
    first = _adapter(tmp_path / "first", 8)
    copy = tmp_path / "copy"
    shutil.copytree(first, copy)
    digest = read_lora_modules({"a": first}).fingerprint["lora_modules"]["a"]  # type: ignore[union-attr]
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 64
    assert read_lora_modules({"a": str(copy)}).fingerprint == {"lora_modules": {"a": digest}}  # type: ignore[union-attr]
    (copy / "adapter_model.safetensors").write_bytes(b"weightz")  # same size, other bytes
    assert read_lora_modules({"a": str(copy)}).fingerprint != {"lora_modules": {"a": digest}}  # type: ignore[union-attr]


def test_a_module_that_is_not_an_adapter_is_refused_before_vllm_starts(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    with pytest.raises(ab.InvalidRequestError, match=r"no adapter_config\.json"):
        ab.create_backend("vllm", model=str(tmp_path), lora_modules={"a": str(tmp_path)})


def test_the_package_adapters_have_distinct_digests(adapters: dict[str, str]) -> None:
    modules = read_lora_modules(adapters)
    assert modules is not None
    assert sorted(modules.names) == sorted(ADAPTER_SEEDS)
    assert len(set(modules.fingerprint["lora_modules"].values())) == len(ADAPTER_SEEDS)
