"""Images and tools on TGI's Messages API, checked against TGI's OpenAPI spec by the look-alike."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

import asyncbackends as ab
from asyncbackends.testing import openapi
from asyncbackends.testing.fake_tgi import FakeTGIServer

from ..chat_tools import add_tool
from .conftest import MakeBackend, MakeServer, noise_png, png

ADD = add_tool()


@pytest.mark.asyncio
async def test_images_go_to_the_messages_api_as_the_spec_defines(
    server: FakeTGIServer, make_backend: MakeBackend
) -> None:
    backend = await make_backend(server.url)
    image = ab.image_part(png())
    messages = [{"role": "user", "content": [{"type": "text", "text": "Describe "}, image]}]
    (result,) = await ab.gather(backend, [ab.GenerationRequest(messages, ab.SamplingParams(max_tokens=3))])
    path, sent = server.received[-1]
    assert path == "/v1/chat/completions" and sent["messages"] == messages
    assert server.schema_violations == []
    assert openapi.request_errors("/v1/chat/completions", sent) == []
    assert result.completions[0].tool_calls == () and result.text


@pytest.mark.asyncio
@pytest.mark.parametrize("choice", ["add", "required"])
async def test_a_forced_tool_choice_comes_back_as_a_tool_call(
    server: FakeTGIServer, make_backend: MakeBackend, choice: str
) -> None:
    backend = await make_backend(server.url)
    request = ab.GenerationRequest([{"role": "user", "content": "1+2?"}], tools=[ADD], tool_choice=choice)
    (result,) = await ab.gather(backend, [request])
    _, sent = server.received[-1]
    assert server.schema_violations == []  # request and response, both by the spec
    # TGI's FunctionDefinition carries the schema as `arguments`; a named choice is {"function": {"name"}}.
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "arguments": dict(ADD.parameters),
            },
        }
    ]
    assert sent["tool_choice"] == (choice if choice == "required" else {"function": {"name": "add"}})
    (call,) = result.completions[0].tool_calls
    assert call.name == "add" and result.completions[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.arguments), ADD.parameters)


@pytest.mark.asyncio
async def test_the_second_turn_goes_by_the_spec(server: FakeTGIServer, make_backend: MakeBackend) -> None:
    backend = await make_backend(server.url)
    call = {"id": "0", "type": "function", "function": {"name": "add", "arguments": '{"x":1,"y":2}'}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "0", "content": "3"},
    ]
    request = ab.GenerationRequest(messages, ab.SamplingParams(max_tokens=2), tools=[ADD], tool_choice="none")
    (result,) = await ab.gather(backend, [request])
    _, sent = server.received[-1]
    # TGI's MessageBody is oneOf content | tool_calls: the empty content is left out beside the calls.
    assert sent["messages"][1] == {"role": "assistant", "tool_calls": [call]}
    assert sent["messages"][2] == messages[2]
    assert server.schema_violations == [] and result.completions[0].tool_calls == ()


@pytest.mark.asyncio
async def test_an_oversized_image_is_refused_before_sending(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server()
    backend = await make_backend(server.url)
    big = ab.image_part(noise_png(900))  # about 2.4 MB once base64: over TGI's default 2,000,000 bytes
    request = ab.GenerationRequest([{"role": "user", "content": [big]}], ab.SamplingParams(max_tokens=1))
    before = len(server.received)
    with pytest.raises(ab.RequestRejectedError, match="payload limit"):
        await ab.gather(backend, [request])
    assert len(server.received) == before  # nothing sent
    # Sent anyway (the check turned off), the look-alike answers as TGI does: 413 with axum's message.
    unchecked = await make_backend(server.url, payload_limit=None)
    with pytest.raises(ab.RequestRejectedError, match="length limit exceeded"):
        await ab.gather(unchecked, [request], retry=ab.RetryPolicy(max_attempts=1))


@pytest.mark.asyncio
async def test_unclaimed_capabilities_and_bad_input_send_nothing(
    server: FakeTGIServer, make_backend: MakeBackend
) -> None:
    backend = await make_backend(server.url)
    before = len(server.received)
    with pytest.raises(ab.InvalidRequestError):
        ab.GenerationRequest([{"role": "user", "content": [{"type": "video", "video": "x"}]}])
    backend.capabilities = ab.Capabilities(chat=True)  # as a text-only deployment would claim
    with pytest.raises(ab.RequestRejectedError, match="images"):
        await ab.gather(
            backend, [ab.GenerationRequest([{"role": "user", "content": [ab.image_part(png())]}])]
        )
    assert len(server.received) == before
