"""The OpenAI Batch API's file formats, as its published reference gives them, against the `openai` adapter.

The reference is the spec's text, written out here: a batch input file is JSONL, one request object a line
(``custom_id``, ``method`` ``"POST"``, ``url``, ``body``), lines separated by LF; an output file line is
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`` and an error file
line ``{"id", "custom_id", "response": null, "error": {"code", "message"}}``; output lines come in any
order. Prompts and answers hold arbitrary Unicode, U+2028 and friends written raw (as servers write JSON).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncbackends as ab
from asyncbackends.abc import BatchStatus
from asyncbackends.testing._serve import serve

TRICKY = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\r", "\n", '"', "\\", "\ufeff"]
texts = st.text(st.one_of(st.characters(codec="utf-8"), st.sampled_from(TRICKY)), max_size=30)


def spec_lines(content: bytes) -> list[dict[str, Any]]:
    """A JSONL file as the spec reads it: LF-separated lines, each one JSON object, the last LF optional."""
    lines = content.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [json.loads(line) for line in lines]


class Files:
    """Serves ``/v1/files/{id}/content`` with the bytes a test puts there; nothing else."""

    def __init__(self) -> None:
        self.content: dict[str, bytes] = {}
        self.url = ""
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/files/{file}/content", self.file)
        self.runner, port = await serve(app)
        self.url = f"http://127.0.0.1:{port}/v1"

    async def file(self, request: web.Request) -> web.Response:
        return web.Response(body=self.content[request.match_info["file"]], content_type="application/jsonl")


@pytest.fixture(scope="module")
def files() -> Iterator[Files]:
    server = Files()
    ab.get_loop_manager().run(server.start())
    yield server
    assert server.runner is not None
    ab.get_loop_manager().run(server.runner.cleanup())


@pytest.fixture(scope="module")
def backend(files: Files) -> Iterator[Any]:
    built = ab.create_backend("openai", base_url=files.url, model="batch-model")
    yield built
    built.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(st.tuples(texts, st.booleans()), min_size=1, max_size=6))
def test_every_input_line_is_one_spec_request_object(backend: Any, prompts: list[tuple[str, bool]]) -> None:
    requests = [
        ab.GenerationRequest([{"role": "user", "content": text}] if chat else text or "x")
        for text, chat in prompts
    ]
    lines = [backend.batch_line(f"request-{i}", r) for i, r in enumerate(requests)]
    content = b"".join(line.data + b"\n" for line in lines)  # the file the adapter uploads
    read = spec_lines(content)
    assert len(read) == len(requests)  # no character of a prompt ends a line early
    for i, (obj, (text, chat)) in enumerate(zip(read, prompts, strict=True)):
        assert set(obj) == {"custom_id", "method", "url", "body"}
        assert obj["custom_id"] == f"request-{i}" and obj["method"] == "POST"
        assert obj["url"] == ("/v1/chat/completions" if chat else "/v1/completions")
        assert obj["url"] == lines[i].endpoint  # one endpoint per batch: the line's own
        assert obj["body"]["model"] == "batch-model"
        sent = obj["body"]["messages"][0]["content"] if chat else obj["body"]["prompt"]
        assert sent == (text if chat else text or "x")


def output_line(custom_id: str, answer: str, chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
    if chat:
        choice["message"] = {"role": "assistant", "content": answer}
    else:
        choice["text"] = answer
    body = {"id": "cmpl-1", "object": "chat.completion" if chat else "text_completion", "created": 0,
            "model": "batch-model", "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}  # fmt: skip
    return {"id": f"batch_req_{custom_id}", "custom_id": custom_id, "error": None,
            "response": {"status_code": 200, "request_id": f"req_{custom_id}", "body": body}}  # fmt: skip


def error_line(custom_id: str, code: str) -> dict[str, Any]:
    return {"id": f"batch_req_{custom_id}", "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": f"this request ended: {code}"}}  # fmt: skip


def refused_line(custom_id: str, message: str) -> dict[str, Any]:
    error = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    return {"id": f"batch_req_{custom_id}", "custom_id": custom_id, "error": None,
            "response": {"status_code": 400, "request_id": f"req_{custom_id}", "body": error}}  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    answers=st.lists(
        st.tuples(texts, st.booleans(), st.sampled_from(["ok", "ok", "expired", "failed", "refused"])),
        min_size=1,
        max_size=8,
    ),
    seed=st.integers(0, 2**16),
    final_newline=st.booleans(),
)
def test_each_request_gets_its_own_line_whatever_the_order_and_text(
    files: Files, backend: Any, answers: list[tuple[str, bool, str]], seed: int, final_newline: bool
) -> None:
    requests, output, errors = {}, [], []
    for i, (text, chat, kind) in enumerate(answers):
        custom_id = f"request-{i}"
        requests[custom_id] = ab.GenerationRequest([{"role": "user", "content": "q"}] if chat else "q")
        if kind == "ok":
            output.append(output_line(custom_id, text, chat))
        elif kind == "refused":
            output.append(refused_line(custom_id, text or "refused"))
        else:
            errors.append(error_line(custom_id, "batch_expired" if kind == "expired" else "server_error"))
    rng = random.Random(seed)
    rng.shuffle(output)  # the spec promises no order
    rng.shuffle(errors)
    for name, lines in (("out", output), ("err", errors)):
        text = "\n".join(json.dumps(line, ensure_ascii=False) for line in lines)
        files.content[name] = (text + ("\n" if final_newline and lines else "")).encode()
    detail = {"output_file_id": "out" if output else None, "error_file_id": "err" if errors else None}
    status = BatchStatus(id="batch_1", status="completed", done=True, detail=detail)
    outcomes = ab.get_loop_manager().run(backend.batch_outcomes(status, requests))
    assert set(outcomes) == set(requests)
    for i, (text, _, kind) in enumerate(answers):
        outcome = outcomes[f"request-{i}"]
        if kind == "ok":
            assert isinstance(outcome, ab.GenerationResult) and outcome.text == text
        elif kind == "refused":
            assert isinstance(outcome, ab.RequestRejectedError) and not outcome.retryable
        elif kind == "expired":
            assert isinstance(outcome, ab.BackendTimeoutError) and "batch_expired" in str(outcome)
        else:
            assert type(outcome) is ab.BackendError and "server_error" in str(outcome)
