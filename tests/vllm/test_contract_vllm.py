"""The adapter contract suite against the vllm adapter on the session's real CPU engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing.contract import BackendContract

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(420)]


class TestVLLMContract(BackendContract):
    # A 256-token generation on the tiny CPU model took about 0.2 s on a quiet machine (the contract then
    # skipped its cancellation checks); at 0.05 s it is still in flight (or, on a loaded machine, not sent yet).
    cancel_after = 0.05
    greedy_batch_invariant = False  # CPU batching changes float32 numerics enough to flip rare argmaxes

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, vllm_backend: ab.AsyncBackend) -> ab.AsyncBackend:
        return vllm_backend

    @pytest.fixture
    def make_backend(self, tiny_model: str) -> Callable[[], ab.AsyncBackend]:
        from .conftest import build_backend

        return lambda: build_backend(tiny_model)  # type: ignore[no-any-return]

    @pytest.fixture
    def rejected_requests(self) -> list[ab.GenerationRequest]:
        return [
            ab.GenerationRequest("word " * 600, ab.SamplingParams(max_tokens=4), request_id="too-long"),
            ab.GenerationRequest([10**7], ab.SamplingParams(max_tokens=4), request_id="out-of-vocabulary"),
        ]

    @pytest.fixture
    def decode(self, hf_tokenizer: Any) -> Callable[[Sequence[int]], str]:
        return lambda ids: str(hf_tokenizer.decode(list(ids), skip_special_tokens=True))
