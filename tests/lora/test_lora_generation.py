"""Generation with LoRA adapters per request against vLLM's offline ``LLM.generate(..., lora_request=...)``."""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab

from .conftest import ADAPTER_SEEDS, REFERENCE_MAX_TOKENS

# The first test to use the package's engine also waits for its start-up (a minute on a busy 2-core machine).
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(420)]

NAMES: list[str | None] = [None, *ADAPTER_SEEDS]


def test_a_mixed_run_equals_offline_generate_for_each_adapter_and_the_base(
    lora_backend: Any, offline_lora: dict[str, list[list[int]]], reference_prompts: list[list[int]]
) -> None:
    # Interleaved: every engine batch mixes the base and the three adapters (vLLM's CPU kernels once computed
    # a base request beside adapter ones with the last slot's adapter: `_lora` keeps that slot empty).
    requests = [
        ab.GenerationRequest(
            ids, ab.SamplingParams(max_tokens=REFERENCE_MAX_TOKENS), request_id=f"{p}-{name}", adapter=name
        )
        for p, ids in enumerate(reference_prompts)
        for name in NAMES * 2
    ]
    results = ab.run_batch(lora_backend, requests)
    got: dict[str, list[list[int]]] = {}
    for request, result in zip(requests, results, strict=True):
        assert result.request_id == request.request_id
        got.setdefault(request.adapter or "", []).append(list(result.completions[0].token_ids))
    for name, rows in got.items():
        assert rows == [row for row in offline_lora[name] for _ in range(2)], name
    # The adapters change outputs (so this test could fail), each its own way.
    for name in ADAPTER_SEEDS:
        assert offline_lora[name] != offline_lora[""], name
    assert len({str(offline_lora[name]) for name in ADAPTER_SEEDS}) == len(ADAPTER_SEEDS)


def test_a_chat_with_an_adapter_is_its_rendered_prompt_with_that_adapter(
    lora_backend: Any, hf_tokenizer: Any
) -> None:
    messages = [{"role": "user", "content": "Paris is the capital of"}]
    rendered = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    rendered = list(getattr(rendered, "input_ids", rendered))
    params = ab.SamplingParams(max_tokens=8)
    requests = [
        ab.GenerationRequest(messages, params, adapter="beta"),
        ab.GenerationRequest(rendered, params, adapter="beta"),
        ab.GenerationRequest(messages, params),
    ]
    chat, by_ids, base = (r.completions[0].token_ids for r in ab.run_batch(lora_backend, requests))
    assert chat == by_ids
    assert chat != base


def test_with_adapter_sends_every_request_with_its_adapter(
    lora_backend: Any, offline_lora: dict[str, list[list[int]]], reference_prompts: list[list[int]]
) -> None:
    gamma = ab.with_adapter(lora_backend, "gamma")
    params = ab.SamplingParams(max_tokens=REFERENCE_MAX_TOKENS)
    results = ab.run_batch(gamma, [ab.GenerationRequest(ids, params) for ids in reference_prompts])
    assert [list(r.completions[0].token_ids) for r in results] == offline_lora["gamma"]
