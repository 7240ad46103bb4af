"""The adapter contract suite against the openai adapter and the package's real `vllm serve`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing.contract import BackendContract

from .conftest import API_KEY, Served

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(600),
]  # the first test starts the server


class TestOpenAIContract(BackendContract):
    # A 256-token generation on the tiny CPU model took about 0.2 s on a quiet machine (the contract then
    # skipped its cancellation checks); at 0.05 s it is still in flight (or, on a loaded machine, not sent yet).
    cancel_after = 0.05
    greedy_batch_invariant = False  # CPU batching changes float32 numerics enough to flip rare argmaxes

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, served: Served) -> Iterator[ab.AsyncBackend]:
        # The server runs a tool-call parser (conftest.py), so tools are claimed and the named choice checked.
        backend = ab.create_backend("openai", base_url=served.base_url, api_key=API_KEY)
        yield backend
        ab.get_loop_manager().run(backend.aclose())

    @pytest.fixture
    def make_backend(self, served: Served) -> Callable[[], ab.AsyncBackend]:
        return lambda: ab.create_backend("openai", base_url=served.base_url, api_key=API_KEY)

    @pytest.fixture
    def failing_backend(self) -> Callable[[], ab.AsyncBackend]:
        # Nothing listens on port 9 of loopback; model given, so building sends nothing.
        return lambda: ab.create_backend(
            "openai", base_url="http://127.0.0.1:9/v1", api_key=API_KEY, model="m"
        )

    @pytest.fixture
    def rejected_requests(self) -> list[ab.GenerationRequest]:
        return [ab.GenerationRequest("word " * 600, ab.SamplingParams(max_tokens=4), request_id="too-long")]

    @pytest.fixture
    def secret(self) -> str:
        return API_KEY

    @pytest.fixture(scope="class")
    @classmethod
    def tokenizer(cls, served: Served) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(served.model)

    @pytest.fixture
    def decode(self, tokenizer: Any) -> Callable[[Sequence[int]], str]:
        return lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=True))
