"""Server-sent event streams against the SSE spec: any Unicode answer, any line endings, any chunking.

The reference is the spec's own rule, written here from its text (WHATWG HTML, "Server-sent events",
"Interpreting an event stream"), and Python's ``json`` decoder for the payloads; never the library's splitter.
Streams are written as servers write them: JSON with its non-ASCII characters raw (TGI's serde_json, vLLM's
pydantic), so U+2028, U+2029 and U+0085 (line breaks to `str.splitlines`, not to SSE) arrive unescaped
inside the strings of an answer. End to end, a raw aiohttp server writes the stream cut into arbitrary
chunks, and the ``tgi`` and ``openai`` adapters must return exactly the answer that was streamed.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncbackends as ab
from asyncbackends.adapters._http.streams import sse_events
from asyncbackends.testing._serve import serve
from asyncbackends.testing.openapi import response_errors

# -- the reference: the spec's text, step by step -------------------------------------------------------


def spec_lines(stream: str) -> Iterator[str]:
    """The stream's complete lines, as the spec reads them.

    "a U+000D CARRIAGE RETURN U+000A LINE FEED (CRLF) character pair, a single U+000A LINE FEED (LF)
    character not preceded by a U+000D CARRIAGE RETURN (CR) character, and a single U+000D CARRIAGE RETURN
    (CR) character not followed by a U+000A LINE FEED (LF) character being the ways in which a line can
    end." Characters after the last line end form no line.
    """
    line: list[str] = []
    i = 0
    while i < len(stream):
        char = stream[i]
        if char == "\r":
            yield "".join(line)
            line = []
            i += 2 if stream[i + 1 : i + 2] == "\n" else 1
        elif char == "\n":
            yield "".join(line)
            line = []
            i += 1
        else:
            line.append(char)
            i += 1


def spec_data(body: bytes) -> list[str]:
    """The data of every event the spec dispatches from ``body``.

    "Event streams are always decoded as UTF-8", and "one leading U+FEFF BYTE ORDER MARK character must be
    ignored". Per line: empty, dispatch; starting with ":", ignore; containing ":", the field is what comes
    before the first colon and the value what comes after, less one leading space; otherwise the whole
    line is the field and the value empty. Field "data": "append the field value to the data buffer, then
    append a single U+000A LINE FEED (LF) character". Dispatch: "if the data buffer is an empty string, ...
    return"; "if the data buffer's last character is a U+000A LINE FEED (LF) character, then remove the
    last character". At the end of the file "the incomplete event is not dispatched".
    """
    stream = body.decode("utf-8")
    if stream.startswith("\ufeff"):
        stream = stream[1:]
    dispatched: list[str] = []
    buffer = ""
    for line in spec_lines(stream):
        if line == "":
            if buffer != "":
                dispatched.append(buffer[:-1] if buffer.endswith("\n") else buffer)
            buffer = ""
            continue
        if line.startswith(":"):
            continue
        if ":" in line:
            name, value = line[: line.index(":")], line[line.index(":") + 1 :]
            if value.startswith(" "):
                value = value[1:]
        else:
            name, value = line, ""
        if name == "data":
            buffer += value + "\n"
    return dispatched


def payloads(body: bytes) -> list[Any]:
    """The JSON values the events carry; ``[DONE]`` is OpenAI's end marker, not JSON."""
    return [json.loads(data) for data in spec_data(body) if data != "[DONE]"]


# -- streams as servers write them --------------------------------------------------------------------

# Line breaks to str.splitlines() that are no line end to SSE, and JSON writes raw; and characters JSON
# escapes (\r, \n, \t, quotes, backslashes). Mixed into arbitrary Unicode so every example is likely to hold some.
TRICKY = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\r", "\n", '"', "\\"]
answer_text = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from(TRICKY)), max_size=40)
line_end = st.sampled_from(["\n", "\r", "\r\n"])


def as_json(value: Any, indent: int | None) -> str:
    """``value`` as a server writes it: non-ASCII characters raw, compact or spread over lines."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


@st.composite
def event_stream(draw: st.DrawFn, values: list[Any], done: bool = False) -> bytes:
    """``values`` written as one event each, with the freedoms the spec gives a server.

    Each line ends in CR, LF or CRLF; an event may carry comments and other fields; its JSON may be spread
    over several data lines (the spec joins them with LF, which JSON reads as whitespace); the space after
    the colon is optional; a byte-order mark may lead.
    """
    lines: list[str] = []
    for value in [*values, *(["[DONE]"] if done else [])]:
        if draw(st.booleans()):
            lines.append(":" + draw(st.sampled_from(["", " keep-alive", "ping"])))
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["event: message", "id: 7", "retry: 3000", "event"])))
        text = value if value == "[DONE]" else as_json(value, draw(st.sampled_from([None, 0, 2])))
        space = draw(st.sampled_from(["", " "]))
        lines.extend(f"data:{space}{part}" for part in text.split("\n"))
        lines.append("")
    out: list[str] = ["\ufeff"] if draw(st.booleans()) else []
    previous = ""
    for line in lines:
        end = draw(line_end)
        if previous == "\r" and line == "" and end == "\n":
            end = "\r\n"  # CR then a blank line's LF would read as one CRLF: that blank line would vanish
        out.append(line + end)
        previous = end
    return "".join(out).encode("utf-8")


@st.composite
def chunked(draw: st.DrawFn, body: bytes) -> list[bytes]:
    """``body`` cut at arbitrary byte offsets (inside a UTF-8 character, a CRLF or a field name too)."""
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(body) - 1)), max_size=12)))
    edges = [0, *(c for c in cuts if c < len(body)), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges) if b > a]


# -- the splitter alone ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.data(), st.lists(answer_text, max_size=6), st.booleans())
def test_sse_events_reads_what_the_spec_dispatches(data: st.DataObject, texts: list[str], done: bool) -> None:
    values = [{"index": i, "text": text} for i, text in enumerate(texts)]
    body = data.draw(event_stream(values, done=done))
    assert payloads(body) == values  # the stream is well formed (the reference's own check)
    assert sse_events(body) == values


# -- end to end: a raw server streams, the adapters answer ------------------------------------------------


@dataclass
class Stream:
    """What the raw server answers next: these chunks, written one by one."""

    chunks: list[bytes] = field(default_factory=list)
    served: int = 0


def raw_app(stream: Stream) -> web.Application:
    """TGI's and OpenAI's routes, each writing ``stream.chunks`` as an event stream."""

    async def streamed(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in stream.chunks:
            await resp.write(chunk)
        await resp.write_eof()
        stream.served += 1
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "x"}]}
        )

    app = web.Application()
    app.router.add_post("/generate_stream", streamed)
    app.router.add_post("/v1/completions", streamed)
    app.router.add_post("/v1/chat/completions", streamed)
    app.router.add_get("/v1/models", models)
    return app


@pytest.fixture(scope="module")
def raw_server() -> Iterator[tuple[str, Stream]]:
    stream = Stream()
    manager = ab.get_loop_manager()

    runner, port = manager.run(serve(raw_app(stream)))
    yield f"http://127.0.0.1:{port}", stream
    manager.run(runner.cleanup())


@pytest.fixture(scope="module")
def backends(raw_server: tuple[str, Stream]) -> Iterator[dict[str, Any]]:
    url, _ = raw_server
    built = {
        "tgi": ab.create_backend("tgi", url=url, token=False),
        "openai": ab.create_backend("openai", base_url=url + "/v1", api_key="k", model="m", server="generic"),
    }
    yield built
    for backend in built.values():
        ab.get_loop_manager().run(backend.aclose())


def tgi_events(tokens: list[str]) -> list[dict[str, Any]]:
    """``/generate_stream``'s events for ``tokens``, as TGI's OpenAPI spec gives ``StreamResponse``."""
    events: list[dict[str, Any]] = []
    for i, text in enumerate(tokens):
        last = i == len(tokens) - 1
        details = {
            "finish_reason": "length",
            "generated_tokens": len(tokens),
            "seed": None,
            "input_length": 3,
        }
        events.append(
            {
                "index": i,
                "token": {"id": 100 + i, "text": text, "logprob": -0.5, "special": False},
                "top_tokens": [],
                "generated_text": "".join(tokens) if last else None,
                "details": details if last else None,
            }
        )
    return events


def openai_chunks(tokens: list[str], chat: bool) -> list[dict[str, Any]]:
    """A ``stream: true`` answer's chunks, as OpenAI's API reference gives them, usage last."""
    base = {
        "id": "c",
        "created": 1,
        "model": "m",
        "object": "chat.completion.chunk" if chat else "text_completion",
    }

    def part(text: str, finish: str | None) -> dict[str, Any]:
        logprobs = (
            {"content": [{"token": text, "logprob": -0.5, "top_logprobs": []}]}
            if chat
            else {"tokens": [text], "token_logprobs": [-0.5], "top_logprobs": [None]}
        )
        body = {"delta": {"content": text}} if chat else {"text": text}
        return {"index": 0, **body, "logprobs": logprobs if text else None, "finish_reason": finish}

    chunks = (
        [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}] if chat else []
    )
    chunks += [{**base, "choices": [part(text, None)]} for text in tokens]
    chunks.append({**base, "choices": [part("", "length")]})
    usage = {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}
    chunks.append({**base, "choices": [], "usage": usage})
    return chunks


SHAPES = ["tgi", "openai-text", "openai-chat"]


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), tokens=st.lists(answer_text.filter(bool), min_size=1, max_size=8))
def test_any_answer_in_any_chunks_comes_back_whole(
    raw_server: tuple[str, Stream],
    backends: dict[str, Any],
    shape: str,
    data: st.DataObject,
    tokens: list[str],
) -> None:
    _, stream = raw_server
    prompt: Any
    if shape == "tgi":
        events = tgi_events(tokens)
        for event in events:
            assert response_errors("/generate_stream", 200, event, content_type="text/event-stream") == []
        body = data.draw(event_stream(events))
        backend, prompt = backends["tgi"], "a prompt"
    else:
        chat = shape == "openai-chat"
        body = data.draw(event_stream(openai_chunks(tokens, chat), done=True))
        backend = backends["openai"]
        prompt = [{"role": "user", "content": "a prompt"}] if chat else "a prompt"
    stream.chunks = data.draw(chunked(body))
    request = ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=len(tokens), logprobs=True))
    served = stream.served
    (result,) = ab.run_batch(
        backend, [request], timeout=ab.Timeouts(idle=60), retry=ab.RetryPolicy(max_attempts=1)
    )
    assert stream.served == served + 1  # streamed (the idle limit applies), once
    assert isinstance(result, ab.GenerationResult)
    (completion,) = result.completions
    assert completion.text == "".join(tokens)
    assert completion.token_texts == tuple(tokens)  # every event read whole, none split or merged


def tool_call_chunks(fragments: list[str]) -> list[dict[str, Any]]:
    """A streamed tool call, as OpenAI's API reference gives it: the id, type and name in the first
    ``delta.tool_calls`` fragment, the arguments' text spread over the following ones."""
    base = {"id": "c", "created": 1, "model": "m", "object": "chat.completion.chunk"}

    def delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": ""}}
    return [
        delta({"role": "assistant", "content": None, "tool_calls": [first]}),
        *(delta({"tool_calls": [{"index": 0, "function": {"arguments": text}}]}) for text in fragments),
        delta({}, "tool_calls"),
    ]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), fragments=st.lists(answer_text, min_size=1, max_size=8))
def test_a_streamed_tool_call_in_any_chunks_comes_back_whole(
    raw_server: tuple[str, Stream], backends: dict[str, Any], data: st.DataObject, fragments: list[str]
) -> None:
    # A generic server's tool requests are streamed under an idle limit (it has no health route to watch
    # them by): the call's arguments, any text in any fragments, must come back exactly.
    _, stream = raw_server
    body = data.draw(event_stream(tool_call_chunks(fragments), done=True))
    stream.chunks = data.draw(chunked(body))
    tool = ab.Tool("add", "Add two integers.", {"type": "object", "properties": {}})
    request = ab.GenerationRequest(({"role": "user", "content": "1+2?"},), tools=(tool,))
    served = stream.served
    (result,) = ab.run_batch(
        backends["openai"], [request], timeout=ab.Timeouts(idle=60), retry=ab.RetryPolicy(max_attempts=1)
    )
    assert stream.served == served + 1
    assert isinstance(result, ab.GenerationResult)
    (completion,) = result.completions
    assert completion.tool_calls == (ab.ToolCall("call_1", "add", "".join(fragments)),)
    assert completion.finish_reason == "tool_calls"
