"""The sampling-parameter table against vLLM itself: its ``SamplingParams`` and its server's request fields.

No engine is started: the in-process adapter's translation is compared with the table's ``vllm`` names, and
the names the ``openai`` adapter sends a vLLM server with the fields vLLM's own request models declare.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._sampling_table import OPTIONAL_SPECS, SAMPLING_TABLE, SamplingParamSpec

pytest.importorskip("vllm")

with warnings.catch_warnings():  # import-time DeprecationWarnings from vLLM and torch, as in the adapter
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from asyncbackends.adapters.vllm._requests import engine_capabilities, vllm_sampling

_CORE = {"max_tokens": 7, "temperature": 0.5, "top_p": 0.5, "top_k": 3, "stop": ("x",), "n": 2, "seed": 11}


def _value(spec: SamplingParamSpec) -> Any:
    return spec.example if spec.optional else _CORE.get(spec.name, True)


@pytest.mark.parametrize("spec", [s for s in SAMPLING_TABLE if s.vllm], ids=lambda s: s.name)
def test_vllm_sampling_sets_the_field_the_table_names(spec: SamplingParamSpec) -> None:
    assert spec.vllm is not None
    if spec.vllm not in VLLMSamplingParams.__struct_fields__:
        pytest.skip(f"this vLLM has no {spec.vllm}")
    value = _value(spec)
    params = ab.SamplingParams(**{"temperature": 0.25, spec.name: value})
    got = getattr(vllm_sampling(params), spec.vllm)
    want = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else value
    assert got == want


def test_the_adapter_claims_every_field_it_translates() -> None:
    caps = engine_capabilities(images=False, max_concurrency=1)
    for spec in OPTIONAL_SPECS:
        if spec.vllm and spec.name != "thinking_budget":  # claimed only where the engine enforces it
            assert getattr(caps, spec.name), spec.name


def test_names_sent_to_a_vllm_server_are_its_request_fields() -> None:
    chat, completions = set(ChatCompletionRequest.model_fields), set(CompletionRequest.model_fields)
    for spec in SAMPLING_TABLE:
        for key in (spec.openai, spec.openai_vllm):
            if key is None:
                continue
            assert key in chat, spec.name
            # reasoning_effort is a chat field only: the openai adapter refuses it for other prompts.
            assert key in completions or spec.name == "reasoning_effort", spec.name
