"""Images, tools and tool calls on the OpenAI wire, checked against the OpenAI SDK's own types."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from openai.types.chat import ChatCompletion
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from pydantic import TypeAdapter

import asyncbackends as ab
from asyncbackends.adapters.openai import OpenAIBackend

from ..chat_tools import add_tool
from . import test_wire
from .test_wire import Stub

# The scripted server and a backend on it, shared with test_wire.
stub = test_wire.stub
backend = test_wire.backend

ADD = add_tool()
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
# The OpenAI SDK's request types, validated strictly enough to reject a wrongly shaped tool or part. A
# generic server's tool requests are streamed under an idle limit (the default), whole without one.
REQUEST = TypeAdapter(CompletionCreateParamsNonStreaming)
STREAMED = TypeAdapter(CompletionCreateParamsStreaming)


def _answer(message: dict[str, Any], finish: str) -> dict[str, Any]:
    # Built through the SDK's response model: the body is what an OpenAI server answers.
    body = ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "m1",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )
    return body.model_dump(mode="json", exclude_none=True)


def _sdk_valid(sent: dict[str, Any]) -> dict[str, Any]:
    # Pydantic validates the TypedDicts, unions included: a bad part or tool choice fails here.
    (STREAMED if sent.get("stream") else REQUEST).validate_python(sent)
    return sent


@pytest.mark.asyncio
async def test_images_and_a_named_tool_go_as_openai_defines_them(stub: Stub, backend: OpenAIBackend) -> None:
    call = {"id": "call_7", "type": "function", "function": {"name": "add", "arguments": '{"x": 1, "y": 2}'}}
    stub.script.append((200, _answer({"content": None, "tool_calls": [call]}, "tool_calls"), {}))
    image = ab.image_part(PNG)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Add what you see."}, image]}]
    request = ab.GenerationRequest(messages, tools=[ADD], tool_choice="add")
    (result,) = await ab.gather(backend, [request])
    path, sent = stub.received[0]
    assert path == "/v1/chat/completions"
    assert sent["stream"] is True  # a generic server's tool request, under the default idle limit
    _sdk_valid(sent)
    assert sent["messages"] == messages
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": dict(ADD.parameters),
            },
        }
    ]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    (completion,) = result.completions
    assert completion.tool_calls == (ab.ToolCall("call_7", "add", '{"x": 1, "y": 2}'),)
    assert completion.finish_reason == "tool_calls" and completion.text == ""


@pytest.mark.asyncio
@pytest.mark.parametrize("choice", ["auto", "none", "required"])
async def test_tool_choice_words_go_as_strings(stub: Stub, backend: OpenAIBackend, choice: str) -> None:
    stub.script.append((200, _answer({"content": "no call"}, "stop"), {}))
    request = ab.GenerationRequest([{"role": "user", "content": "hi"}], tools=[ADD], tool_choice=choice)
    (result,) = await ab.gather(backend, [request])
    sent = _sdk_valid(stub.received[0][1])
    assert sent["tool_choice"] == choice and result.text == "no call"
    assert result.completions[0].tool_calls == () and result.completions[0].finish_reason == "stop"


@pytest.mark.asyncio
async def test_second_turn_sends_tool_calls_and_results_as_they_are(
    stub: Stub, backend: OpenAIBackend
) -> None:
    stub.script.append((200, _answer({"content": "1 + 2 = 3"}, "stop"), {}))
    call = {"id": "call_7", "type": "function", "function": {"name": "add", "arguments": '{"x": 1, "y": 2}'}}
    messages = [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_7", "content": "3"},
    ]
    (result,) = await ab.gather(backend, [ab.GenerationRequest(messages, tools=[ADD])])
    sent = _sdk_valid(stub.received[0][1])
    assert sent["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert sent["messages"][2] == messages[2]
    assert result.text == "1 + 2 = 3"


@pytest.mark.asyncio
async def test_no_tools_sends_no_tool_fields(stub: Stub, backend: OpenAIBackend) -> None:
    stub.script.append((200, _answer({"content": "a"}, "stop"), {}))
    await ab.gather(backend, [ab.GenerationRequest([{"role": "user", "content": "hi"}])])
    assert "tools" not in stub.received[0][1] and "tool_choice" not in stub.received[0][1]


@pytest.mark.asyncio
async def test_a_malformed_tool_call_is_a_malformed_response(stub: Stub, backend: OpenAIBackend) -> None:
    body = _answer({"content": "x"}, "stop")
    body["choices"][0]["message"]["tool_calls"] = [{"id": "", "type": "function", "function": {"name": "f"}}]
    stub.script.append((200, body, {}))
    once = ab.RetryPolicy(max_attempts=1)
    with pytest.raises(ab.BackendError, match=r"malformed OpenAI-compatible response: .*ToolCall\.id"):
        await ab.gather(backend, [ab.GenerationRequest([{"role": "user", "content": "hi"}])], retry=once)


@pytest.mark.asyncio
async def test_disclaimed_tools_and_images_are_refused_before_sending(stub: Stub) -> None:
    built = await ab.acreate_backend(
        "openai", base_url=stub.url, api_key="sk-stub", tools=False, images=False
    )
    try:
        assert not built.capabilities.tools and not built.capabilities.images
        requests = [
            ab.GenerationRequest([{"role": "user", "content": "hi"}], tools=[ADD], tool_choice="add"),
            ab.GenerationRequest([{"role": "user", "content": [ab.image_part(PNG)]}]),
        ]
        results = await ab.gather(built, requests, return_exceptions=True)
        assert [type(r) for r in results] == [ab.RequestRejectedError, ab.RequestRejectedError]
        assert "tools" in str(results[0]) and "images" in str(results[1])
        assert stub.received == []
    finally:
        await built.aclose()
