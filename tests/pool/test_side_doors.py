"""Wrappers keep the side doors integrations read: tokenizer, max_model_len, check_ready, info.

`limited` forwards what its backend has; a pool (and ``engines=N``, a pool of engines) what every replica
has and shares. Read through lighteval's ``max_length`` and inspect's logprob tokens, which fell back to
4096 and ``token_id:N`` on every wrapper.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.abc import (
    SupportsAdaptiveLimit,
    SupportsCheckReady,
    SupportsInfo,
    SupportsMaxModelLen,
    SupportsTokenizer,
)
from asyncbackends.adapters.mock import MockBackend


class CharTokenizer:
    """The mock's own tokens: one character, id = its code point."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


class Served(MockBackend):
    """A mock describing its server (TGI's ``/info``) and nothing more."""

    name = "engine"  # not "mock": the integrations' mock rules must not answer for it

    async def info(self, request_id: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(model_id=self.model)


class Engine(Served):
    """A mock with the side doors an engine has: a tokenizer and a context length besides."""

    def __init__(self, max_model_len: int = 2048, **options: Any) -> None:
        super().__init__(**options)
        self.tokenizer = CharTokenizer()
        self.max_model_len = max_model_len


def test_limited_forwards_what_its_backend_has_and_only_that() -> None:
    engine = Engine()
    wrapped = ab.limited(engine, concurrency=2)
    assert wrapped.tokenizer is engine.tokenizer and wrapped.max_model_len == 2048
    assert asyncio.run(wrapped.info()).model_id == engine.model
    asyncio.run(wrapped.check_ready())
    for protocol in (SupportsTokenizer, SupportsMaxModelLen, SupportsCheckReady, SupportsInfo):
        assert isinstance(wrapped, protocol), protocol
    assert isinstance(wrapped, SupportsAdaptiveLimit)
    inner = MockBackend()  # no tokenizer, no info: neither has the wrapper
    plain = ab.limited(inner)
    for side_door in ("tokenizer", "max_model_len", "info", "check_ready"):
        assert hasattr(plain, side_door) == hasattr(inner, side_door), side_door
    assert not isinstance(plain, SupportsInfo) and not isinstance(plain, SupportsTokenizer)
    assert isinstance(plain, SupportsCheckReady)  # the mock has a readiness check
    wrapped.close()
    plain.close()


def test_a_pool_forwards_what_every_replica_shares() -> None:
    small, large = Engine(max_model_len=2048), Engine(max_model_len=4096)
    pooled = ab.pool([small, ab.limited(large)])
    try:
        assert pooled.tokenizer is small.tokenizer
        assert pooled.max_model_len == 2048  # the smallest: a prompt must fit wherever it is routed
        assert isinstance(pooled, SupportsTokenizer) and isinstance(pooled, SupportsMaxModelLen)
        assert not hasattr(pooled, "info")  # a server's own description is no pool's
        nested = ab.pool([pooled])
        assert nested.max_model_len == 2048
        nested.close()
    finally:
        pooled.close()
    mixed = ab.pool([Engine(), Served()])  # one replica without a tokenizer or a context length
    try:
        assert not hasattr(mixed, "tokenizer") and not hasattr(mixed, "max_model_len")
    finally:
        mixed.close()


@pytest.mark.parametrize("wrap", ["limited", "pool"])
def test_lighteval_reads_the_context_length_through_a_wrapper(tmp_path: Path, wrap: str) -> None:
    pytest.importorskip("lighteval")
    from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

    engine = Engine(max_model_len=2048)
    backend = ab.limited(engine) if wrap == "limited" else ab.pool([engine])
    config = AsyncBackendsModelConfig(model_name="engine", cache_dir=str(tmp_path / "cache"), progress=False)
    model = AsyncBackendsModel(config, backend=backend)
    try:
        assert model.max_length == 2048  # not lighteval's fallback of 4096
        assert model.tokenizer is engine.tokenizer
    finally:
        model.cleanup()
        backend.close()


@pytest.mark.filterwarnings("ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning")
@pytest.mark.parametrize("wrap", ["limited", "pool"])
def test_inspect_names_logprob_tokens_through_a_wrapper(tmp_path: Path, wrap: str) -> None:
    pytest.importorskip("inspect_ai")
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import generate

    from asyncbackends.integrations.inspect_ai import inspect_model

    engine = Engine()
    backend = ab.limited(engine) if wrap == "limited" else ab.pool([engine])
    try:
        task = Task(dataset=[Sample(input="hi", target="hi")], solver=[generate()])
        [log] = eval(task, model=inspect_model(backend), log_dir=str(tmp_path), display="none", logprobs=True)
    finally:
        backend.close()
    assert log.samples is not None and log.samples[0].error is None, log.error
    choice = log.samples[0].output.choices[0]
    assert choice.logprobs is not None
    tokens = [p.token for p in choice.logprobs.content]
    assert "".join(tokens) == choice.message.text  # the tokenizer's texts, not "token_id:117"
