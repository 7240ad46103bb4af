"""``engines=2`` with LoRA adapters: every engine knows every adapter by the same id, and serves it exactly.

These engines are told to wrap the ``lm_head`` too (``lora_target_modules``, as vLLM does where it is not
given): vLLM's CPU LoRA logits kernel then runs, prompt logprobs cannot be asked in batches, and the scorer
asks every scored token as a one-token continuation (`_lora.prompt_logprobs_work`), checked here against
transformers + peft. Named to run after the package engine's tests: two more engine starts (together, on a
CPU).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing._tiny_lora import TINY_LORA_TARGET_MODULES

from ..parity._split_references import lighteval_pair
from ..tiny_engine import build_backend
from ..transformers_reference import token_logprobs
from .conftest import ADAPTER_SEEDS, REFERENCE_MAX_TOKENS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

NAMES: list[str | None] = [None, *ADAPTER_SEEDS]
COPIES = 4  # each (prompt, adapter) this many times: enough requests in flight for both engines


@pytest.fixture(scope="module")
def two_engines(base_model: str, adapters: dict[str, str]) -> Iterator[Any]:
    targets = [*TINY_LORA_TARGET_MODULES, "lm_head"]
    backend = build_backend(base_model, engines=2, lora_modules=adapters, lora_target_modules=targets)
    yield backend
    backend.close()


def test_two_engines_serve_each_adapter_as_offline_generate(
    two_engines: Any, offline_lora: dict[str, list[list[int]]], reference_prompts: list[list[int]]
) -> None:
    engines = two_engines.engines
    assert len(engines) == 2
    ids = [{n: r.lora_int_id for n, r in e._adapters._requests.items()} for e in engines]
    assert ids[0] == ids[1] == {"alpha": 1, "beta": 2, "gamma": 3}
    assert two_engines.capabilities.adapters is True
    assert two_engines.fingerprint == engines[0].fingerprint == engines[1].fingerprint
    served: list[Counter[str]] = [Counter(), Counter()]
    for engine, counts in zip(engines, served, strict=True):
        real_add = engine.engine.add_request

        async def counting_add(
            *args: Any, _real: Any = real_add, _counts: Any = counts, **kwargs: Any
        ) -> Any:
            lora = kwargs.get("lora_request")
            _counts[lora.lora_name if lora is not None else ""] += 1
            return await _real(*args, **kwargs)

        engine.engine.add_request = counting_add
    try:
        requests = [
            ab.GenerationRequest(ids, ab.SamplingParams(max_tokens=REFERENCE_MAX_TOKENS), adapter=name)
            for _ in range(COPIES)
            for ids in reference_prompts
            for name in NAMES
        ]
        results = ab.run_batch(two_engines, requests)
    finally:
        for engine in engines:
            del engine.engine.add_request
    for index, (request, result) in enumerate(zip(requests, results, strict=True)):
        prompt = (index // len(NAMES)) % len(reference_prompts)
        assert list(result.completions[0].token_ids) == offline_lora[request.adapter or ""][prompt], index
    # Both engines served adapter requests (the pool's routing split the run).
    assert all(sum(c[n] for n in ADAPTER_SEEDS) > 0 for c in served), served
    assert sum(sum(c.values()) for c in served) == len(requests)


def test_where_the_lm_head_is_wrapped_each_token_is_scored_alone_and_equals_peft(
    two_engines: Any, peft_models: dict[str, Any], hf_tokenizer: Any
) -> None:
    assert not any(engine._scoring.mode.prompt_logprobs for engine in two_engines.engines)
    pairs = [("The quick brown", " fox jumps"), ("Question: What is two plus two? Answer:", " four.")]
    requests = [
        ab.LoglikelihoodRequest(context, continuation, request_id=f"{i}-{name}", adapter=name)
        for i, (context, continuation) in enumerate(pairs)
        for name in NAMES
    ]
    results = {r.request_id: r for r in ab.run_batch(two_engines, requests)}
    for i, (context, continuation) in enumerate(pairs):
        ids, scored = lighteval_pair(hf_tokenizer, context, continuation)
        for name in NAMES:
            parts, greedy = token_logprobs(peft_models[name or ""], ids, scored)
            result = results[f"{i}-{name}"]
            assert result.token_logprobs == pytest.approx(parts, abs=1e-4), (name, context)
            assert result.is_greedy is greedy
