"""Each eval framework's name for a sampling parameter, as the table gives it, sets that `SamplingParams` field.

Asked through the integration's own translation (lm-eval's ``gen_kwargs``, lighteval's
``GenerationParameters``, inspect's ``GenerateConfig``) with one parameter set, and compared with the value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._sampling_table import SAMPLING_TABLE, SamplingParamSpec

_CORE = {"max_tokens": 7, "temperature": 0.5, "top_p": 0.5, "top_k": 3, "stop": ("x",), "n": 2, "seed": 11}


def _value(spec: SamplingParamSpec) -> Any:
    return spec.example if spec.optional else _CORE.get(spec.name, True)


def _framework(value: Any) -> Any:
    """A value as a framework holds it: a sequence as a list."""
    return list(value) if isinstance(value, tuple) else value


@pytest.fixture
def lm() -> Iterator[Any]:
    lm_eval = pytest.importorskip("asyncbackends.integrations.lm_eval")
    model = lm_eval.AsyncBackendsLM("mock", progress=False)
    yield model
    model.close()


@pytest.mark.parametrize(
    ("spec", "key"),
    [(s, key) for s in SAMPLING_TABLE for key in s.lm_eval],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_lm_eval_gen_kwargs_names(lm: Any, spec: SamplingParamSpec, key: str) -> None:
    value = _value(spec)
    params = lm.sampling_params({"do_sample": True, "temperature": 0.25, key: _framework(value)})
    assert getattr(params, spec.name) == value


@pytest.mark.parametrize("spec", [s for s in SAMPLING_TABLE if s.lighteval], ids=lambda s: s.name)
def test_lighteval_generation_parameters_names(tmp_path: Path, spec: SamplingParamSpec) -> None:
    pytest.importorskip("lighteval")
    from lighteval.models.model_input import GenerationParameters
    from lighteval.tasks.requests import Doc

    from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

    assert spec.lighteval is not None
    value = _value(spec)
    generation = {"temperature": 0.25, spec.lighteval: _framework(value)}
    config = AsyncBackendsModelConfig(
        model_name="mock-echo",
        cache_dir=str(tmp_path / "cache"),
        progress=False,
        generation_parameters=GenerationParameters(**generation),
    )
    model = AsyncBackendsModel(config)
    try:
        params = model.sampling_params(Doc(query="q", choices=["x"], gold_index=0, task_name="t|0"))
        assert getattr(params, spec.name) == value
    finally:
        model.cleanup()


@pytest.mark.parametrize("spec", [s for s in SAMPLING_TABLE if s.inspect_ai], ids=lambda s: s.name)
def test_inspect_generate_config_names(spec: SamplingParamSpec) -> None:
    pytest.importorskip("inspect_ai")
    from inspect_ai.model import GenerateConfig

    from asyncbackends.integrations import _inspect_convert as convert

    assert spec.inspect_ai is not None
    value = _value(spec)
    every = {f.name: True for f in dataclasses.fields(ab.Capabilities) if f.name != "max_concurrency"}
    config = GenerateConfig(**{"temperature": 0.25, spec.inspect_ai: _framework(value)})
    params = convert.sampling_params(config, ab.Capabilities(**every), "mock")
    assert getattr(params, spec.name) == value
