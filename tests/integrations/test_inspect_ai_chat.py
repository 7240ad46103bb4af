"""Tools, tool calls and images through the inspect_ai provider, driven by inspect's own `eval`.

Tool calls go through the openai adapter to a small local server that speaks OpenAI's chat completions: it
answers the first request with a tool call, inspect runs the tool, and the second request must carry the
tool's result.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")
pytest.importorskip("aiohttp")

from aiohttp import web
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.log import EvalLog
from inspect_ai.model import ChatMessageUser, ContentAudio, ContentImage, ContentText, Model, get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import Tool, tool

import asyncbackends as ab
from asyncbackends._chat import image_digest
from asyncbackends.integrations import _inspect_convert as convert
from asyncbackends.testing._serve import serve

from .test_inspect_ai import _close

pytestmark = pytest.mark.filterwarnings("ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning")

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c63f8cfc0f01f0005"
    "00020155f7f7a60000000049454e44ae426082"
)


@tool
def add() -> Tool:
    async def execute(x: int, y: int) -> int:
        """Add two integers.

        Args:
            x: The first.
            y: The second.
        """
        return x + y

    return execute


class ChatServer:
    """``/v1/models`` and ``/v1/chat/completions`` answering each POST with the next scripted message."""

    def __init__(self) -> None:
        self.script: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner, port = await serve(app)
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "m1", "object": "model", "owned_by": "x"}]}
        )

    async def _chat(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        message, finish = self.script.pop(0)
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.received)}",
                "object": "chat.completion",
                "created": 0,
                "model": "m1",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15},
            }
        )


@pytest.fixture
def server() -> Iterator[ChatServer]:
    served = ChatServer()
    ab.get_loop_manager().run(served.start())
    yield served
    ab.get_loop_manager().run(served.stop())


@pytest.fixture
def openai_model(server: ChatServer) -> Iterator[Model]:
    model = get_model("asyncbackends/openai/m1", memoize=False, base_url=server.url, api_key="sk-test")
    yield model
    _close(model)


def _call(arguments: str) -> dict[str, Any]:
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": arguments}}
    return {"content": None, "tool_calls": [call]}


def _eval_with_add(tmp_path: Path, model: Model) -> EvalLog:
    task = Task(dataset=[Sample(input="What is 1 + 2?")], solver=[use_tools(add()), generate()])
    (log,) = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    return log


def test_inspect_runs_the_tool_and_the_second_request_carries_its_result(
    tmp_path: Path, server: ChatServer, openai_model: Model
) -> None:
    server.script = [(_call('{"x": 1, "y": 2}'), "tool_calls"), ({"content": "It is 3."}, "stop")]
    log = _eval_with_add(tmp_path, openai_model)
    first, second = server.received
    assert first["tools"][0]["function"]["name"] == "add"
    assert first["tools"][0]["function"]["parameters"]["properties"]["x"]["type"] == "integer"
    assert first["tool_choice"] == "auto"
    assistant, result = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"x": 1, "y": 2}'}
    assert result == {"role": "tool", "tool_call_id": "call_1", "content": "3"}
    assert log.samples is not None
    sample = log.samples[0]
    assert sample.output.completion == "It is 3."
    calls = [m for m in sample.messages if m.role == "assistant" and m.tool_calls]
    assert calls[0].tool_calls is not None
    assert calls[0].tool_calls[0].arguments == {"x": 1, "y": 2}
    assert sample.output.usage is not None
    # The server's usage, both ways (output tokens were an estimate from the text before: 2).
    assert (sample.output.usage.input_tokens, sample.output.usage.output_tokens) == (11, 4)


def test_arguments_that_are_not_json_become_a_parse_error_the_model_is_told(
    tmp_path: Path, server: ChatServer, openai_model: Model
) -> None:
    server.script = [(_call("{x: 1"), "tool_calls"), ({"content": "sorry"}, "stop")]
    log = _eval_with_add(tmp_path, openai_model)
    assert log.samples is not None
    calls = [m for m in log.samples[0].messages if m.role == "assistant" and m.tool_calls]
    assert calls[0].tool_calls is not None
    assert calls[0].tool_calls[0].parse_error is not None
    result = server.received[1]["messages"][-1]
    assert result["role"] == "tool"
    assert result["content"].startswith("Error: ")


def test_tool_choice_maps_any_to_required_and_a_function_to_its_name() -> None:
    from inspect_ai.tool import ToolFunction

    assert convert.tool_choice_of("any") == "required"
    assert convert.tool_choice_of("none") == "none"
    assert convert.tool_choice_of(ToolFunction(name="add")) == "add"


def test_images_reach_the_backend_as_image_parts(tmp_path: Path) -> None:
    url = ab.image_part(PNG)["image_url"]["url"]
    model = get_model("asyncbackends/mock", memoize=False)
    try:
        message = ChatMessageUser(content=[ContentText(text="what is this?"), ContentImage(image=url)])
        task = Task(dataset=[Sample(input=[message])], solver=[generate()])
        (log,) = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
        assert log.samples is not None
        # The mock echoes an image as its digest: the very bytes arrived.
        assert log.samples[0].output.completion == f"user: what is this?[image {image_digest(url)}]"
    finally:
        _close(model)


def test_other_media_are_refused_naming_the_part() -> None:
    message = ChatMessageUser(content=[ContentAudio(audio="data:audio/wav;base64,AA==", format="wav")])
    with pytest.raises(ab.InvalidRequestError, match=r"input\[0\]\.content\[0\] is ContentAudio"):
        convert.messages_of([message])


def test_tool_results_keep_their_call_id() -> None:
    from inspect_ai.model import ChatMessageAssistant, ChatMessageTool
    from inspect_ai.tool import ToolCall

    messages = convert.messages_of(
        [
            ChatMessageAssistant(
                content="", tool_calls=[ToolCall(id="c9", function="add", arguments={"x": 1})]
            ),
            ChatMessageTool(content="1", tool_call_id="c9", function="add"),
        ]
    )
    assert messages[0]["tool_calls"] == [
        {"id": "c9", "type": "function", "function": {"name": "add", "arguments": json.dumps({"x": 1})}}
    ]
    assert messages[1] == {"role": "tool", "tool_call_id": "c9", "content": "1"}
