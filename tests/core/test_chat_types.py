"""Chat types: content parts, images, tools and tool calls, validated when built (asyncbackends._chat)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

import asyncbackends as ab
from asyncbackends._refusals import refuse_unclaimed_chat
from tests.chat_tools import add_tool

ADD = add_tool()


def _png(size: tuple[int, int] = (3, 2), color: str = "red") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def _user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


def test_image_part_turns_local_data_into_a_base64_data_url(tmp_path: Path) -> None:
    png = _png()
    path = tmp_path / "red.png"
    path.write_bytes(png)
    expected = {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
    }
    assert ab.image_part(png) == expected
    assert ab.image_part(path) == expected
    assert ab.image_part(str(path)) == expected
    # A PIL image is sent as PNG: the data URL decodes to the same pixels.
    url = ab.image_part(Image.open(io.BytesIO(png)))["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert decoded.size == (3, 2) and decoded.convert("RGB").getpixel((0, 0)) == (255, 0, 0)
    jpeg = io.BytesIO()
    Image.new("RGB", (2, 2)).save(jpeg, format="JPEG")
    assert ab.image_part(jpeg.getvalue())["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_image_part_keeps_urls_as_they_are() -> None:
    assert ab.image_part("https://example.com/cat.png") == {
        "type": "image_url",
        "image_url": {"url": "https://example.com/cat.png"},
    }


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (b"not an image", "not a PNG, JPEG, GIF or WebP"),
        (42, "image_part takes"),
        ("data:image/png;base64,@@@", "not base64"),
    ],
)
def test_image_part_refuses_what_is_no_image(image: object, message: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=message):
        ab.image_part(image)


def test_image_part_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ab.InvalidRequestError, match="cannot read"):
        ab.image_part(tmp_path / "missing.png")


def test_content_parts_are_copied_and_normalised() -> None:
    part = ab.image_part(_png())
    messages = _user({"type": "text", "text": "What is this?"}, part)
    request = ab.GenerationRequest(messages)
    assert request.prompt_kind == "chat"
    assert request.prompt[0]["content"] == [{"type": "text", "text": "What is this?"}, part]  # type: ignore[index]
    assert request.images == (part["image_url"]["url"],)
    part["image_url"]["url"] = "https://changed"  # the request holds its own copy
    assert request.images[0].startswith("data:image/png")
    # The string shorthand some clients send becomes OpenAI's object.
    short = ab.GenerationRequest(_user({"type": "image_url", "image_url": "https://x/y.png"}))
    assert short.prompt[0]["content"][0] == {"type": "image_url", "image_url": {"url": "https://x/y.png"}}  # type: ignore[index]
    assert ab.GenerationRequest("text").images == ()


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        (_user({"type": "audio", "audio": "x"}), r"prompt\[0\].content\[0\].type"),
        (_user({"type": "text"}), r"prompt\[0\].content\[0\]"),
        (_user({"type": "image_url", "image_url": {"url": "data:image/png;base64,***"}}), "not base64"),
        (_user({"type": "image_url", "image_url": {"url": "data:image/png,raw"}}), "base64 data URL"),
        (_user({"type": "image_url", "image_url": {"url": "/etc/passwd"}}), "ab.image_part"),
        (_user({"type": "image_url", "image_url": {"url": "file:///x.png"}}), "ab.image_part"),
        (
            _user({"type": "image_url", "image_url": {"url": "data:text/plain;base64,eA=="}}),
            "must be an image",
        ),
        (_user({"type": "image_url", "image_url": {"url": "https://x", "size": 3}}), r"content\[0\]"),
        ([{"role": "user", "content": []}], r"prompt\[0\].content"),
        (
            [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]}],
            "user messages only",
        ),
        ([{"role": "tool", "content": "3"}], r"prompt\[0\].tool_call_id"),
        ([{"role": "tool", "content": "3", "tool_call_id": ""}], r"prompt\[0\].tool_call_id"),
        ([{"role": "user", "content": "x", "tool_call_id": "a"}], "unknown keys"),
        (
            [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}],
            r"prompt\[0\].tool_calls\[0\]",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "f"}}],
                }
            ],
            r"prompt\[0\].tool_calls\[0\]",
        ),
        ([{"role": "assistant", "content": None}], r"prompt\[0\].content"),
    ],
)
def test_bad_messages_name_the_field(prompt: object, field: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=field):
        ab.GenerationRequest(prompt)  # type: ignore[arg-type]


def test_a_tool_conversation_round_trips_in_openai_shape() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"x": 1, "y": 2}'}}
    messages = [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    request = ab.GenerationRequest(messages, tools=[ADD], tool_choice="add")
    assert request.prompt[1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert request.prompt[2] == messages[2]
    assert request.uses_tools and request.tools == (ADD,)
    # A ToolCall object is taken in an assistant message too, and arguments given as a dict become JSON text.
    again = ab.GenerationRequest(
        [
            messages[0],
            {"role": "assistant", "content": "", "tool_calls": [ab.ToolCall("call_1", "add", "{}")]},
        ]
    )
    assert again.prompt[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": "{}"}  # type: ignore[index]
    as_dict = ab.ToolCall.from_openai({"id": "c", "function": {"name": "f", "arguments": {"a": 1}}})
    assert as_dict == ab.ToolCall("c", "f", '{"a": 1}')


def test_tools_in_openai_shape_are_read() -> None:
    request = ab.GenerationRequest(_user({"type": "text", "text": "hi"}), tools=[ADD.to_openai()])
    assert request.tools == (ADD,)
    assert ADD.to_openai() == {
        "type": "function",
        "function": {"name": "add", "description": "Add two integers.", "parameters": dict(ADD.parameters)},
    }
    assert hash(ab.Tool("f")) == hash(ab.Tool("f"))


def test_a_tools_strict_flag_is_kept_and_its_keys_come_in_openais_order() -> None:
    # OpenAI's FunctionDefinition, and vLLM's model of it, order name, description, parameters, strict: a chat
    # template writing the tool with tojson sees that order (issue 53 item 1).
    given = {
        "type": "function",
        "function": {"strict": True, "parameters": dict(ADD.parameters), "name": "add"},
    }
    tool = ab.GenerationRequest(_user({"type": "text", "text": "hi"}), tools=[given]).tools[0]
    assert tool.strict is True and tool != ab.Tool("add", parameters=ADD.parameters)
    assert list(tool.to_openai()["function"]) == ["name", "parameters", "strict"]
    assert list(ADD.to_openai()["function"]) == ["name", "description", "parameters"]
    with pytest.raises(ab.InvalidRequestError, match="strict"):
        ab.Tool("f", strict="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tools": [ADD], "tool_choice": "sub"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": "add"}, "tool_choice"),
        ({"tool_choice": 3}, "tool_choice"),
        ({"tools": [ADD, ADD]}, "distinct names"),
        ({"tools": ADD}, "tools must be a sequence"),
        ({"tools": [{"type": "function"}]}, "function"),
        ({"tools": [{"type": "retrieval", "function": {}}]}, "tool must be"),
    ],
)
def test_bad_tools_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=field):
        ab.GenerationRequest([{"role": "user", "content": "x"}], **kwargs)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("bad name",), "Tool.name"),
        (("f", "", {"type": "string"}), "JSON Schema object"),
        (("f", "", []), "JSON Schema object"),
        (("f", "", {"type": "object", "properties": {"x": 1}}), "properties"),
        (("f", "", {"type": "object", "required": "x"}), "required"),
        (("f", "", {"type": "object", "default": float("nan")}), "JSON-serialisable"),
        (("f", 3), "description"),
    ],
)
def test_bad_tool_schemas_are_refused(args: tuple[Any, ...], field: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=field):
        ab.Tool(*args)


def test_tools_need_a_chat_prompt() -> None:
    with pytest.raises(ab.InvalidRequestError, match="chat prompt"):
        ab.GenerationRequest("text", tools=[ADD])


def test_tool_calls_on_completions() -> None:
    call = ab.ToolCall("call_1", "add", '{"x": 1, "y": 2}')
    completion = ab.Completion("", tool_calls=[call])
    assert completion.tool_calls == (call,) and completion.finish_reason == "tool_calls"
    assert ab.Completion("", tool_calls=(call,), finish_reason="length").finish_reason == "length"
    assert ab.Completion("x").tool_calls == () and ab.Completion("x", tool_calls=None).tool_calls == ()  # type: ignore[arg-type]
    with pytest.raises(ab.InvalidRequestError, match="tool_calls"):
        ab.Completion("", tool_calls=[{"id": "c"}])  # type: ignore[list-item]
    with pytest.raises(ab.InvalidRequestError, match=r"ToolCall\.id"):
        ab.ToolCall("", "add")
    with pytest.raises(ab.InvalidRequestError, match=r"ToolCall\.arguments"):
        ab.ToolCall("c", "add", {"x": 1})  # type: ignore[arg-type]


def test_capabilities_default_to_no_images_and_no_tools() -> None:
    assert (ab.Capabilities().images, ab.Capabilities().tools) == (False, False)


def test_unclaimed_images_and_tools_are_refused_naming_them() -> None:
    image = ab.GenerationRequest(_user(ab.image_part(_png())))
    tools = ab.GenerationRequest([{"role": "user", "content": "x"}], tools=[ADD])
    history = ab.GenerationRequest([{"role": "tool", "tool_call_id": "c", "content": "3"}])
    none = ab.Capabilities()
    for request, what in ((image, "images"), (tools, "tools"), (history, "tools")):
        with pytest.raises(ab.RequestRejectedError, match=f"does not accept {what}") as info:
            refuse_unclaimed_chat(request, none, backend="b", reasons={what: "why not"})
        assert "why not" in str(info.value) and not info.value.retryable
    refuse_unclaimed_chat(image, ab.Capabilities(images=True), backend="b")
    refuse_unclaimed_chat(tools, ab.Capabilities(tools=True), backend="b")
    refuse_unclaimed_chat(ab.GenerationRequest("plain"), none, backend="b")


def test_mock_refuses_what_it_is_told_not_to_claim(make_mock: Any) -> None:
    backend = make_mock(images=False, tools=False)
    requests = [
        ab.GenerationRequest(_user(ab.image_part(_png())), request_id="img"),
        ab.GenerationRequest([{"role": "user", "content": "x"}], tools=[ADD], request_id="tool"),
    ]
    results = ab.run_batch(backend, requests, return_exceptions=True)
    assert [type(r) for r in results] == [ab.RequestRejectedError, ab.RequestRejectedError]
    assert sum(backend.attempts.values()) == 0  # refused before an attempt was made


def test_chat_requests_and_tool_call_results_pickle() -> None:
    # Ray replicas receive requests and send results back pickled.
    import pickle

    request = ab.GenerationRequest(_user(ab.image_part(_png())), tools=[ADD], tool_choice="add")
    again = pickle.loads(pickle.dumps(request))
    assert again == request and again.tools[0].parameters == ADD.parameters
    completion = ab.Completion("", tool_calls=(ab.ToolCall("c", "add", "{}"),))
    assert pickle.loads(pickle.dumps(completion)) == completion


@pytest.mark.parametrize("word", ["auto", "none", "required"])
def test_a_tool_named_as_a_tool_choice_mode_is_refused_when_that_word_is_the_choice(word: str) -> None:
    # tool_choice is one str for modes and names alike: the word would be read as the mode, never forcing
    # the tool the caller may have meant; refused rather than guessed.
    named = ab.Tool(word)
    ask = [{"role": "user", "content": "x"}]
    with pytest.raises(ab.InvalidRequestError, match=f"tool named '{word}' cannot be told from"):
        ab.GenerationRequest(ask, tools=[named, ADD], tool_choice=word)
    # Any other choice is unambiguous: the tool is offered like any other, and can be forced by another name.
    other = "none" if word != "none" else "auto"
    assert ab.GenerationRequest(ask, tools=[named, ADD], tool_choice=other).tools == (named, ADD)
    assert ab.GenerationRequest(ask, tools=[named, ADD], tool_choice="add").tool_choice == "add"
