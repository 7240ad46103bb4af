"""`FakeOpenAIBatchServer`: an OpenAI Files + Batches API look-alike on aiohttp.web, for tests and demos.

It follows OpenAI's published spec: ``POST /v1/files`` (multipart, ``purpose=batch``) stores a JSONL input
file; ``POST /v1/batches`` starts a batch over it (``endpoint``, ``completion_window: "24h"``);
``GET /v1/batches/{id}`` reports it (``validating`` -> ``in_progress`` -> ``finalizing`` ->
``completed``, or ``failed``, ``expired``, ``cancelled``, with ``request_counts``);
``GET /v1/batches`` lists them newest first (``limit``, ``after``); ``POST /v1/batches/{id}/cancel``
stops one; ``GET /v1/files/{id}/content`` returns the output and error files, one
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`` per line (answers
other than 200, and ``batch_expired`` / ``batch_cancelled`` lines, in the error file). ``POST
/v1/completions`` and ``/v1/chat/completions`` answer the same requests directly with the same
deterministic answers (`_fake_openai.answers`), so the batch and plain paths can be compared; ``GET
/v1/models`` lists the one model.

Faults: ``hold`` keeps every batch ``in_progress`` (nothing answered) until `release`; ``fail_batches``
and ``expire_batches`` name batches by creation number (1 for the first): the first fail validation, the
second expire with half their lines answered; prompts with ``[reject]`` or ``[fail]`` are answered 400 or
500 (some lines with errors). Counters: `answered` counts every generation answered, by request (both
paths), `batch_answered` and `plain_answered` each path's; `uploads`, `created` and `polls` count the
batch API calls. Inside a test:

```python
async with FakeOpenAIBatchServer() as server:
    backend = await ab.acreate_backend("openai", base_url=server.url, batch_poll_interval=0.01)
```

In its own process: ``python -m asyncbackends.testing.fake_openai_batches --port 8000`` (the faults as flags:
``--hold``, released by SIGUSR1, ``--fail-batches N``, ``--expire-batches N``), which prints
``listening on http://127.0.0.1:PORT/v1`` once it serves.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Collection
from typing import Any

from aiohttp import web

from ._fake_openai.answers import answer, error_body, line_key
from ._fake_openai.validation import validate_lines
from ._serve import serve

__all__ = ["FakeOpenAIBatchServer"]

_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
_FINISHED = ("completed", "failed", "expired", "cancelled")


class FakeOpenAIBatchServer:
    """An OpenAI look-alike with the Batch API, listening on ``host`` at ``port`` (0 picks a free one).

    Args:
        model: The base model served.
        adapters: LoRA adapters served beside it, by name: a request (or batch line) whose ``model`` names
            one is answered as that adapter (each text starts with ``[name]``); ``/v1/models`` lists them.
        hold: Keep batches ``in_progress`` until `release` is called.
        fail_batches: Creation numbers of the batches that fail validation.
        expire_batches: Creation numbers of the batches that expire after answering half their lines.
        max_requests: Most lines in one batch (more fails validation).
        max_bytes: Most bytes in one uploaded file (more is refused with 400).
        host: Address to listen on.
        port: Port to listen on; 0 picks a free one (read `url` after start).
    """

    def __init__(
        self,
        *,
        model: str = "fake-batch-model",
        adapters: Collection[str] = (),
        hold: bool = False,
        fail_batches: Collection[int] = (),
        expire_batches: Collection[int] = (),
        max_requests: int = 50_000,
        max_bytes: int = 200 * 1024 * 1024,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.model, self.hold = model, hold
        self.adapters = tuple(adapters)
        self.fail_batches, self.expire_batches = set(fail_batches), set(expire_batches)
        self.max_requests, self.max_bytes = max_requests, max_bytes
        self.host, self.port = host, port
        self.files: dict[str, dict[str, Any]] = {}  # id -> FileObject
        self.contents: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}  # id -> Batch object, in creation order
        self.answered: Counter[str] = Counter()
        self.batch_answered: Counter[str] = Counter()
        self.plain_answered: Counter[str] = Counter()
        self.uploads = 0
        self.created = 0
        self.polls: Counter[str] = Counter()
        self.paths: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self._changed: asyncio.Condition | None = None
        self._released: asyncio.Event | None = None

    # -- lifecycle -----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The API root, ``/v1`` included, as the ``openai`` adapter's ``base_url`` takes it."""
        return f"http://{self.host}:{self.port}/v1"

    def app(self) -> web.Application:
        """The aiohttp application (routes only; `start` serves it)."""
        app = web.Application(client_max_size=self.max_bytes + 2**20)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._plain)
        app.router.add_post("/v1/chat/completions", self._plain)
        app.router.add_post("/v1/files", self._upload)
        app.router.add_get("/v1/files/{id}", self._file)
        app.router.add_get("/v1/files/{id}/content", self._content)
        app.router.add_post("/v1/batches", self._create)
        app.router.add_get("/v1/batches", self._list)
        app.router.add_get("/v1/batches/{id}", self._batch)
        app.router.add_post("/v1/batches/{id}/cancel", self._cancel)
        return app

    async def start(self) -> FakeOpenAIBatchServer:
        """Start listening; `url` is valid afterwards."""
        self._changed = asyncio.Condition()
        self._released = asyncio.Event()
        if not self.hold:
            self._released.set()
        self._runner, self.port = await serve(self.app(), self.host, self.port)
        return self

    async def stop(self) -> None:
        """Stop listening and processing."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> FakeOpenAIBatchServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def release(self) -> None:
        """Let held batches run."""
        self.hold = False
        if self._released is not None:
            self._released.set()

    async def wait_until(self, condition: Callable[[FakeOpenAIBatchServer], bool]) -> None:
        """Return once ``condition(self)`` holds (checked after each request the server handles)."""
        assert self._changed is not None, "start the server first"
        async with self._changed:
            await self._changed.wait_for(lambda: condition(self))

    async def _notify(self) -> None:
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()

    # -- plain requests ------------------------------------------------------------------------------

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
        return web.json_response(error_body(message, kind), status=status)

    async def _models(self, request: web.Request) -> web.Response:
        self.paths[request.path] += 1
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "asyncbackends-testing"}
            for name in (self.model, *self.adapters)
        ]
        return web.json_response({"object": "list", "data": data})

    async def _plain(self, request: web.Request) -> web.Response:
        self.paths[request.path] += 1
        try:
            body = await request.json()
        except ValueError:
            return self._error(400, "the body is not JSON")
        status, answered = answer(request.path, body, self.model, self.adapters)
        key = line_key(request.path, body)
        self.answered[key] += 1
        self.plain_answered[key] += 1
        await self._notify()
        return web.json_response(answered, status=status)

    # -- files ---------------------------------------------------------------------------------------

    def _new_file(self, content: bytes, purpose: str, filename: str) -> dict[str, Any]:
        file_id = f"file-{len(self.files) + 1:06d}"
        self.files[file_id] = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        self.contents[file_id] = content
        return self.files[file_id]

    async def _upload(self, request: web.Request) -> web.Response:
        self.paths[request.path] += 1
        if not request.content_type.startswith("multipart/"):
            return self._error(400, "files are uploaded as multipart/form-data")
        form = await request.post()
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            return self._error(400, f"'purpose' must be 'batch' here, got {purpose!r}")
        if not isinstance(upload, web.FileField):
            return self._error(400, "'file' is missing")
        content = upload.file.read()
        if len(content) > self.max_bytes:
            return self._error(400, f"the file is {len(content)} bytes, over the {self.max_bytes} limit")
        self.uploads += 1
        created = self._new_file(content, "batch", upload.filename)
        await self._notify()
        return web.json_response(created)

    async def _file(self, request: web.Request) -> web.Response:
        found = self.files.get(request.match_info["id"])
        return web.json_response(found) if found else self._error(404, "no such file")

    async def _content(self, request: web.Request) -> web.Response:
        self.paths["/v1/files/{id}/content"] += 1
        content = self.contents.get(request.match_info["id"])
        if content is None:
            return self._error(404, "no such file")
        return web.Response(body=content, content_type="application/octet-stream")

    # -- batches -------------------------------------------------------------------------------------

    async def _create(self, request: web.Request) -> web.Response:
        self.paths[request.path] += 1
        try:
            body = await request.json()
        except ValueError:
            return self._error(400, "the body is not JSON")
        file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
        if file_id not in self.files or self.files[file_id]["purpose"] != "batch":
            return self._error(404, f"no batch input file {file_id!r}")
        if endpoint not in _ENDPOINTS:
            return self._error(400, f"endpoint must be one of {', '.join(_ENDPOINTS)}, got {endpoint!r}")
        if body.get("completion_window") != "24h":
            return self._error(400, "completion_window must be '24h'")
        self.created += 1
        batch_id = f"batch_{self.created:06d}"
        now = int(time.time())
        self.batches[batch_id] = {
            "id": batch_id,
            "object": "batch",
            "endpoint": endpoint,
            "errors": None,
            "input_file_id": file_id,
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "expires_at": now + 86400,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
            "model": self.model,
        }
        task = asyncio.get_running_loop().create_task(self._process(batch_id, self.created))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await self._notify()
        return web.json_response(self.batches[batch_id])

    async def _batch(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return self._error(404, "no such batch")
        self.polls[batch["id"]] += 1
        await self._notify()
        return web.json_response(batch)

    async def _list(self, request: web.Request) -> web.Response:
        self.paths[request.path] += 1
        listed = list(reversed(self.batches.values()))
        after = request.query.get("after")
        if after:
            ids = [b["id"] for b in listed]
            listed = listed[ids.index(after) + 1 :] if after in ids else []
        limit = max(1, min(100, int(request.query.get("limit", "20"))))
        page = listed[:limit]
        return web.json_response(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(listed) > limit,
            }
        )

    async def _cancel(self, request: web.Request) -> web.Response:
        self.paths["/v1/batches/{id}/cancel"] += 1
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return self._error(404, "no such batch")
        if batch["status"] not in _FINISHED:
            batch["status"], batch["cancelling_at"] = "cancelling", int(time.time())
        await self._notify()
        return web.json_response(batch)

    async def _process(self, batch_id: str, number: int) -> None:
        batch = self.batches[batch_id]
        problem: dict[str, Any] | None = None
        if number in self.fail_batches:
            problem = {
                "code": "invalid_request",
                "message": "this batch was set to fail",
                "param": None,
                "line": 1,
            }
            lines: list[dict[str, Any]] = []
        else:
            content = self.contents[batch["input_file_id"]]
            lines, problem = validate_lines(content, batch["endpoint"], self.max_requests)
        if problem is not None:
            batch.update(
                status="failed", failed_at=int(time.time()), errors={"object": "list", "data": [problem]}
            )
            await self._notify()
            return
        batch.update(status="in_progress", in_progress_at=int(time.time()))
        batch["request_counts"]["total"] = len(lines)
        await self._notify()
        assert self._released is not None
        await self._released.wait()
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        counts = batch["request_counts"]
        stop_at = len(lines) // 2 if number in self.expire_batches else len(lines)
        for position, line in enumerate(lines):
            reason = "batch_expired" if position >= stop_at else None
            if batch["status"] == "cancelling":
                reason = "batch_cancelled"
            if reason is not None:
                message = f"This request was not executed ({reason})."
                errors.append(
                    self._output(batch_id, position, line, None, {"code": reason, "message": message})
                )
                continue
            status, body = answer(line["url"], line["body"], self.model, self.adapters)
            key = line_key(line["url"], line["body"])
            self.answered[key] += 1
            self.batch_answered[key] += 1
            response = {"status_code": status, "request_id": f"req_{batch_id}_{position}", "body": body}
            (outputs if status == 200 else errors).append(
                self._output(batch_id, position, line, response, None)
            )
            counts["completed" if status == 200 else "failed"] += 1
            if position % 100 == 99:
                await asyncio.sleep(0)  # polls answered while a big batch runs
        cancelled = batch["status"] == "cancelling"
        batch["status"] = "finalizing"
        for name, found in (("output_file_id", outputs), ("error_file_id", errors)):
            if found:
                content = b"".join(json.dumps(o).encode() + b"\n" for o in found)
                batch[name] = self._new_file(content, "batch_output", f"{batch_id}_{name}.jsonl")["id"]
        final = "cancelled" if cancelled else "expired" if stop_at < len(lines) else "completed"
        batch.update(status=final, **{f"{final}_at": int(time.time())})
        await self._notify()

    @staticmethod
    def _output(
        batch_id: str, position: int, line: dict[str, Any], response: Any, error: Any
    ) -> dict[str, Any]:
        return {
            "id": f"{batch_id}_req_{position}",
            "custom_id": line["custom_id"],
            "response": response,
            "error": error,
        }


if __name__ == "__main__":
    from ._fake_openai.cli import main

    main(FakeOpenAIBatchServer)
