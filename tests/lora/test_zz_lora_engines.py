"""``engines=2`` with LoRA adapters: every engine knows every adapter by the same id, and serves it exactly.

Named to run after the package engine's tests: two more engine starts (together, on a CPU).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import asyncbackends as ab

from ..tiny_engine import build_backend
from .conftest import ADAPTER_SEEDS, REFERENCE_MAX_TOKENS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

NAMES: list[str | None] = [None, *ADAPTER_SEEDS]
COPIES = 4  # each (prompt, adapter) this many times: enough requests in flight for both engines


@pytest.fixture(scope="module")
def two_engines(base_model: str, adapters: dict[str, str]) -> Iterator[Any]:
    backend = build_backend(base_model, engines=2, lora_modules=adapters)
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
