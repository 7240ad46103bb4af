"""Loglikelihoods with LoRA adapters per request against transformers + peft on the same weights (float32)."""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab

from ..parity._split_references import lighteval_pair
from ..transformers_reference import token_logprobs
from .conftest import ADAPTER_SEEDS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(420)]

PAIRS = [
    ("The quick brown", " fox jumps"),  # several scored tokens
    ("Paris is the capital of", " France"),
    ("Question: What is two plus two? Answer:", " four."),
    ("Once upon a time", " there"),  # one scored token: the choice-group path
    ("Once upon a time", " the"),
    ("", "Once upon a time"),  # empty context: BOS stands in
]
ROLLING = "Once upon a time there was a small model that lived on a CPU."


def test_loglikelihoods_equal_transformers_with_peft_for_each_adapter_and_the_base(
    lora_backend: Any, peft_models: dict[str, Any], hf_tokenizer: Any
) -> None:
    names: list[str | None] = [None, *ADAPTER_SEEDS]
    # One run, every adapter's requests interleaved with the base's.
    requests = [
        ab.LoglikelihoodRequest(context, continuation, request_id=f"{i}-{name}", adapter=name)
        for i, (context, continuation) in enumerate(PAIRS)
        for name in names
    ]
    requests += [ab.RollingLoglikelihoodRequest(ROLLING, request_id=f"rolling-{n}", adapter=n) for n in names]
    results = {r.request_id: r for r in ab.run_batch(lora_backend, requests)}
    rolling_ids = hf_tokenizer(ROLLING, add_special_tokens=False).input_ids
    sums: dict[str, list[float]] = {}
    for name in names:
        model = peft_models[name or ""]
        for i, (context, continuation) in enumerate(PAIRS):
            ids, scored = lighteval_pair(hf_tokenizer, context, continuation)
            parts, greedy = token_logprobs(model, ids, scored)
            result = results[f"{i}-{name}"]
            assert result.num_tokens == scored
            assert result.token_logprobs == pytest.approx(parts, abs=1e-4), (name, context, continuation)
            assert result.logprob == pytest.approx(sum(parts), abs=1e-4)
            assert result.is_greedy is greedy
            sums.setdefault(name or "", []).append(result.logprob)
        parts, _ = token_logprobs(model, [hf_tokenizer.bos_token_id, *rolling_ids], len(rolling_ids))
        rolling = results[f"rolling-{name}"]
        assert rolling.num_tokens == len(rolling_ids)
        assert rolling.token_logprobs == pytest.approx(parts, abs=1e-4), name
    # On a CPU too, the adapters' several-token choices were read from prompt logprobs asked in batches with
    # other adapters' and the base's (lora_target_modules leaves vLLM's CPU LoRA logits kernel out: _lora).
    assert lora_backend._scoring.mode.prompt_logprobs
    assert all(lora_backend._adapters._scorings[name].prompt_requests > 0 for name in ADAPTER_SEEDS)
    # The adapters move every score (so the comparison could fail).
    for name in ADAPTER_SEEDS:
        assert all(abs(a - b) > 1e-2 for a, b in zip(sums[name], sums[""], strict=True)), name
