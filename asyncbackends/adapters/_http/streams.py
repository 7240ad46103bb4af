"""Streamed answers put back together: server-sent events into the body the non-streamed call returns.

The HTTP adapters stream their generations (TGI's ``/generate_stream``, OpenAI's ``stream: true``) so that
`gather`'s idle limit (``ab.Timeouts.idle``) sees every token arrive, and a generation that keeps producing is
never cut however long it runs. The streamed events are then assembled into exactly the body the
non-streamed route answers (``/generate``'s ``Details``, a ``completion`` / ``chat.completion`` object), and
the adapters parse that with their usual parsers: one parsing path, the same text, token ids, logprobs,
finish reasons, usage and tool calls either way, and any field another change reads from a message
(``reasoning_content``...) is carried over too, since every string field of a chat delta is concatenated.

Pure functions, no I/O. They raise ``KeyError``, ``TypeError``, ``IndexError`` or ``ValueError`` on events
that are not what the wire format promises (the adapter reports a malformed response); an error event
inside the stream is returned by `stream_error` for the adapter to map.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["assemble_generate", "assemble_openai", "sse_events", "stream_error"]

# The SSE spec's end of line: CRLF, a lone LF or a lone CR, and nothing else.
_SSE_LINE_END = re.compile(r"\r\n|\r|\n")


def sse_events(body: bytes) -> list[Any]:
    """The JSON payloads of a server-sent event stream's ``data`` fields, ``[DONE]`` left out.

    Lines end at CR, LF or CRLF only, as the SSE spec says (HTML, "Interpreting an event stream"): not at
    the other line breaks `str.splitlines` knows (U+2028, U+2029, U+0085, form feeds...), which servers
    write raw inside the JSON strings of an answer. A leading byte-order mark is dropped; a last event the
    stream ends without a blank line after is kept (a server that closes right after its last line).

    Raises:
        ValueError: A body that is not UTF-8, or a data field that is not JSON.
    """
    text = body.decode("utf-8")
    events: list[Any] = []
    data: list[str] = []
    for line in [*_SSE_LINE_END.split(text.removeprefix("\ufeff")), ""]:
        if not line:  # a blank line ends an event
            if data:
                payload = "\n".join(data)
                if payload.strip() != "[DONE]":
                    events.append(json.loads(payload))
                data = []
            continue
        field, _, value = line.partition(":")
        if field == "data":  # a line "data" without a colon is the field with an empty value
            data.append(value[1:] if value.startswith(" ") else value)
        # Comments (":"), event names, ids and retry times carry nothing the answer needs.
    return events


def stream_error(events: Sequence[Any]) -> Mapping[str, Any] | None:
    """The first event that reports an error instead of output (TGI's and vLLM's mid-stream failures)."""
    for event in events:
        if isinstance(event, Mapping) and event.get("error") is not None:
            return event
    return None


def assemble_generate(events: Sequence[Any]) -> dict[str, Any]:
    """``/generate``'s answer (``details: true``) from ``/generate_stream``'s events.

    Each event carries one token; the last one the whole text and the details (finish reason, seed and the
    prompt's length, which the non-streamed route gives as the ``x-prompt-tokens`` header instead).
    """
    if not events:
        raise ValueError("the stream ended without an event")
    last = events[-1]
    details = last["details"]
    if last.get("generated_text") is None or details is None:
        raise ValueError("the stream ended before its final event (no generated_text)")
    return {
        "generated_text": last["generated_text"],
        "details": {
            "finish_reason": details["finish_reason"],
            "generated_tokens": details.get("generated_tokens"),
            "seed": details.get("seed"),
            "input_length": details.get("input_length"),
            "prefill": [],
            "tokens": [event["token"] for event in events],
        },
    }


def assemble_openai(chunks: Sequence[Any], *, chat: bool) -> dict[str, Any]:
    """A ``completion`` (or ``chat.completion``) object from the chunks of its ``stream: true`` answer.

    Text, logprobs and token ids are concatenated per choice ``index``; a chat delta's string fields
    (``content``, ``reasoning_content``...) too, and its ``tool_calls`` merged by their ``index`` (the id,
    type and name from the first fragment, the arguments concatenated); the finish reason is the last one
    given; ``usage`` comes from the final chunk (``stream_options.include_usage``).
    """
    choices: dict[int, dict[str, Any]] = {}
    body: dict[str, Any] = {"object": "chat.completion" if chat else "text_completion", "choices": []}
    for chunk in chunks:
        for key in ("id", "model", "created", "system_fingerprint"):
            if chunk.get(key) is not None and key not in body:
                body[key] = chunk[key]
        if chunk.get("usage"):
            body["usage"] = chunk["usage"]
        for part in chunk.get("choices") or ():
            index = int(part.get("index", 0))
            choice = choices.get(index)
            if choice is None:
                choice = choices[index] = {"index": index, "finish_reason": None}
                if chat:
                    choice["message"] = {"role": "assistant", "content": None}
                else:
                    choice["text"] = ""
            if chat:
                _merge_delta(choice["message"], part.get("delta") or {})
            else:
                choice["text"] += part.get("text") or ""
            _merge_logprobs(choice, part.get("logprobs"), chat)
            if part.get("token_ids") is not None:
                choice.setdefault("token_ids", []).extend(part["token_ids"])
            if part.get("finish_reason") is not None:
                choice["finish_reason"] = part["finish_reason"]
            if part.get("stop_reason") is not None:
                choice["stop_reason"] = part["stop_reason"]
    body["choices"] = [choices[i] for i in sorted(choices)]
    return body


def _merge_delta(message: dict[str, Any], delta: Mapping[str, Any]) -> None:
    for key, value in delta.items():
        if key == "tool_calls":
            _merge_tool_calls(message, value or ())
        elif key == "role":
            message["role"] = value or message["role"]
        elif isinstance(value, str):
            message[key] = (message.get(key) or "") + value
        elif value is not None and key not in message:
            message[key] = value


def _merge_tool_calls(message: dict[str, Any], fragments: Sequence[Mapping[str, Any]]) -> None:
    calls: list[dict[str, Any]] = message.setdefault("tool_calls", [])
    for fragment in fragments:
        index = int(fragment.get("index", len(calls)))
        while len(calls) <= index:
            calls.append({"id": None, "type": "function", "function": {"name": None, "arguments": ""}})
        call = calls[index]
        if fragment.get("id"):
            call["id"] = fragment["id"]
        if fragment.get("type"):
            call["type"] = fragment["type"]
        function = fragment.get("function") or {}
        if function.get("name"):
            call["function"]["name"] = function["name"]
        call["function"]["arguments"] += function.get("arguments") or ""


def _merge_logprobs(choice: dict[str, Any], logprobs: Any, chat: bool) -> None:
    if not logprobs:
        return
    held = choice.setdefault("logprobs", {})
    keys = ("content",) if chat else ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    for key in keys:
        if logprobs.get(key) is not None:
            held.setdefault(key, []).extend(logprobs[key])
