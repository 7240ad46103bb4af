"""What a LoRA backend refuses before sending, and what it claims and keys its cache on."""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab

from .conftest import ADAPTER_SEEDS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(420)]


def test_an_unknown_adapter_is_refused_before_sending_naming_the_known_ones(lora_backend: Any) -> None:
    engine = lora_backend.engine
    sent = []
    real_add = engine.add_request

    async def counting_add(*args: Any, **kwargs: Any) -> Any:
        sent.append(args)
        return await real_add(*args, **kwargs)

    engine.add_request = counting_add
    try:
        requests = [
            ab.GenerationRequest("The quick brown fox", ab.SamplingParams(max_tokens=4), adapter="delta"),
            ab.LoglikelihoodRequest("The quick brown", " fox", adapter="delta"),
            ab.RollingLoglikelihoodRequest("The quick brown fox", adapter="delta"),
        ]
        results = ab.run_batch(lora_backend, requests, return_exceptions=True)
    finally:
        del engine.add_request
    assert sent == []
    for result in results:
        assert isinstance(result, (ab.InvalidRequestError, ab.RequestRejectedError)), result
        assert "'delta'" in str(result)
        assert all(name in str(result) for name in ADAPTER_SEEDS), str(result)


def test_it_claims_adapters_and_its_fingerprint_holds_each_adapters_digest(lora_backend: Any) -> None:
    from asyncbackends.adapters._lora_dirs import read_lora_modules

    assert lora_backend.capabilities.adapters is True
    # What a router reads to keep an adapter's requests where it is loaded: the names and the engine's slots.
    assert lora_backend.adapters == tuple(sorted(ADAPTER_SEEDS))
    assert lora_backend.max_loras == lora_backend.engine.vllm_config.lora_config.max_loras
    fingerprint = lora_backend.fingerprint
    assert set(fingerprint["lora_modules"]) == set(ADAPTER_SEEDS)
    expected = read_lora_modules({n: m.path for n, m in lora_backend._adapters.modules.by_name.items()})
    assert fingerprint["lora_modules"] == expected.fingerprint["lora_modules"]
    assert (fingerprint["enable_lora"], fingerprint["max_lora_rank"]) == (True, 8)
