"""The ``vllm`` adapter's reasoning options refused clearly, before an engine starts or a request is sent."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing.tiny_model import build_tiny_reasoning_model

from ..processes import engine_core_pids

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


@pytest.mark.slow  # imports vLLM
@pytest.mark.parametrize(("name", "close"), [("deepseek_r2", "deepseek_r1"), ("qwen_3", "qwen3")])
def test_an_unknown_parser_is_refused_with_the_close_names_before_the_engine_starts(
    name: str, close: str
) -> None:
    before = engine_core_pids()
    with pytest.raises(
        ab.InvalidRequestError, match=rf"reasoning_parser='{name}' is not one of vLLM's.*{close}"
    ):
        ab.create_backend("vllm", model=str(build_tiny_reasoning_model()), reasoning_parser=name)
    assert engine_core_pids() == before  # refused before an engine core was started


def _request(**params: Any) -> ab.GenerationRequest:
    return ab.GenerationRequest("hello", ab.SamplingParams(max_tokens=4, **params))


@pytest.mark.slow
def test_an_engine_without_a_parser_claims_no_reasoning_and_refuses_a_budget(tiny_vllm_engine: Any) -> None:
    caps = tiny_vllm_engine.capabilities
    assert not caps.reasoning and not caps.thinking_budget and not caps.reasoning_effort
    run = ab.get_loop_manager().run
    with pytest.raises(ab.RequestRejectedError, match=r"thinking_budget.*reasoning_parser=NAME"):
        run(tiny_vllm_engine.generate(_request(thinking_budget=4)))
    with pytest.raises(ab.RequestRejectedError, match=r"reasoning_effort.*no effort setting"):
        run(tiny_vllm_engine.generate(_request(reasoning_effort="low")))
    # Untouched otherwise: no reasoning field on an ordinary model.
    [completion] = run(tiny_vllm_engine.generate(_request())).completions
    assert completion.reasoning is None and completion.reasoning_tokens == 0
