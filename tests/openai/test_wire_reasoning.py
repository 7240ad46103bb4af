"""Reasoning on the openai adapter without an engine (a scripted stub): the server's ``reasoning_content`` /
``reasoning`` fields read, ``reasoning_effort`` sent, ``thinking_budget`` sent to vLLM only, refusals before
sending. The real `vllm serve` split is compared in tests/reasoning."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import asyncbackends as ab
from asyncbackends.adapters.openai import OpenAIBackend

from .test_wire import Stub, completion
from .test_wire import backend as backend  # the adapter on this module's stub

pytestmark = pytest.mark.asyncio
CHAT = [{"role": "user", "content": "hi"}]


def chat_body(message: dict[str, Any], finish: str = "stop", **usage: Any) -> dict[str, Any]:
    return {
        "model": "m1",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 9, **usage},
    }


@pytest_asyncio.fixture(params=["openai", "vllm"])
async def stub(request: pytest.FixtureRequest) -> AsyncIterator[Stub]:
    server = await Stub([{"id": "m1", "object": "model", "owned_by": request.param}]).start()
    yield server
    await server.stop()


async def _one(backend: OpenAIBackend, prompt: Any, **params: Any) -> ab.Completion:
    [result] = await ab.gather(backend, [ab.GenerationRequest(prompt, ab.SamplingParams(**params))])
    [completion] = result.completions
    return completion  # type: ignore[no-any-return]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_the_servers_thinking_is_read_apart_from_the_answer(
    stub: Stub, backend: OpenAIBackend, field: str
) -> None:
    details = {"completion_tokens_details": {"reasoning_tokens": 5}}
    stub.script.append((200, chat_body({"content": "4", field: "two and two"}, **details), {}))
    got = await _one(backend, CHAT, reasoning_effort="low")
    assert (got.text, got.reasoning, got.reasoning_tokens) == ("4", "two and two", 5)
    assert not got.reasoning_truncated and got.finish_reason == "stop"
    assert stub.received[0][1]["reasoning_effort"] == "low"


async def test_cut_off_while_thinking_gives_no_answer(stub: Stub, backend: OpenAIBackend) -> None:
    stub.script.append((200, chat_body({"content": None, "reasoning": "hmm, let"}, "length"), {}))
    got = await _one(backend, CHAT, max_tokens=3)
    assert (got.text, got.reasoning, got.reasoning_truncated) == ("", "hmm, let", True)
    assert got.finish_reason == "length"


async def test_an_answer_cut_off_after_thinking_is_not_truncated_thinking(
    stub: Stub, backend: OpenAIBackend
) -> None:
    stub.script.append((200, chat_body({"content": "The ans", "reasoning": "ok"}, "length"), {}))
    got = await _one(backend, CHAT, max_tokens=3)
    assert (got.text, got.reasoning, got.reasoning_truncated) == ("The ans", "ok", False)


async def test_a_completions_choice_carries_its_thinking_where_a_server_gives_it(
    stub: Stub, backend: OpenAIBackend
) -> None:
    stub.script.append((200, completion("", reasoning_content="so"), {}))  # finish "length"
    got = await _one(backend, "hello", max_tokens=2)
    assert (got.text, got.reasoning, got.reasoning_truncated) == ("", "so", True)
    stub.script.append((200, completion("plain"), {}))
    plain = await _one(backend, "hello", max_tokens=2)
    assert (plain.text, plain.reasoning, plain.reasoning_truncated) == ("plain", None, False)


async def test_thinking_budget_goes_to_vllm_and_is_refused_elsewhere(
    stub: Stub, backend: OpenAIBackend
) -> None:
    if backend.server == "vllm":
        stub.script.append((200, chat_body({"content": "a", "reasoning": "b"}), {}))
        await _one(backend, CHAT, thinking_budget=7)
        assert stub.received[0][1]["thinking_token_budget"] == 7
    else:
        with pytest.raises(ab.RequestRejectedError, match=r"thinking_budget.*server='vllm'"):
            await _one(backend, CHAT, thinking_budget=7)
        assert stub.received == []


async def test_reasoning_effort_on_a_text_prompt_is_refused_before_sending(
    stub: Stub, backend: OpenAIBackend
) -> None:
    with pytest.raises(ab.RequestRejectedError, match="reasoning_effort is a chat completions field"):
        await _one(backend, "hello", reasoning_effort="high")
    assert stub.received == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"thinking_budget": -1}, "thinking_budget"),
        ({"thinking_budget": 1.5}, "thinking_budget"),
    ],
)
async def test_bad_reasoning_values_are_refused_at_construction(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=message):
        ab.SamplingParams(**params)
