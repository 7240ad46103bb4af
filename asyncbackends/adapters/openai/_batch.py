"""The ``openai`` adapter's provider batches: OpenAI's Files + Batches API, as `SupportsBatch` asks.

Following OpenAI's published spec: each request is a JSONL line ``{"custom_id", "method": "POST", "url":
"/v1/chat/completions" | "/v1/completions", "body"}`` whose body is exactly what ``generate`` posts; the
file is uploaded to ``POST /files`` (multipart, ``purpose=batch``); ``POST /batches`` starts the batch
(``endpoint``, ``completion_window: "24h"``); ``GET /batches/{id}`` is polled; once ``completed``,
``expired``, ``failed`` or ``cancelled``, the output and error files are read from ``GET
/files/{id}/content``. Each output line ``{"custom_id", "response": {"status_code", "body"}, "error"}``
comes back as ``generate`` would have returned it: a 200 body parsed by the same code, any other status
mapped as the plain path maps it (`_http.error_for_status`), a line's own ``error`` by its code
(``batch_expired`` -> `BackendTimeoutError`, ``batch_cancelled`` -> a retryable `BackendError`). A batch
that failed validation fails each of its requests with `RequestRejectedError` carrying the provider's
errors. ``GET /batches`` (paged) finds the batch started over a file, for a run killed before it recorded
the batch id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import aiohttp

from ..._batch import BatchLimits, BatchLine, BatchStatus
from ..._types import GenerationRequest, GenerationResult
from ...errors import BackendError, BackendTimeoutError, RequestRejectedError
from .._http.transport import HTTPResponse, HTTPTransport
from ._lora import ServerAdapters, model_for
from ._wire import completion_payload

__all__ = ["OpenAIBatches"]

_FINISHED = ("completed", "failed", "expired", "cancelled")
_MAX_LIST_PAGES = 20  # batches listed newest first: ours, when it exists, is among the latest


class OpenAIBatches:
    """`SupportsBatch` for `OpenAIBackend`: the members it reads are declared here."""

    name: ClassVar[str]
    model: str
    server: str
    _cache_key: bool
    batch_limits: BatchLimits
    _http: HTTPTransport
    _api: str
    adapters: ServerAdapters
    _batch_adapters: set[str]  # the adapters batch lines named (loaded before their file is uploaded)

    if TYPE_CHECKING:  # provided by the backend; declared for the type checker only

        def _json(self, resp: HTTPResponse, rid: str | None) -> Any: ...

        def _check_open(self, request_id: str | None = None) -> None: ...

        def _refuse(self, request: GenerationRequest) -> None: ...

        def _result(self, request: GenerationRequest, body: Any) -> GenerationResult: ...

        async def _listed(self) -> set[str]: ...

    def batch_line(self, custom_id: str, request: GenerationRequest) -> BatchLine | None:
        """The request's JSONL line, with the body ``generate`` would post; ``None`` for ``max_tokens=0``.

        Raises:
            RequestRejectedError: A parameter this server cannot honour (as ``generate`` refuses it).
        """
        self._check_open(request.request_id)
        self._refuse(request)
        if request.params.max_tokens == 0:
            return None
        url = "/v1/chat/completions" if request.prompt_kind == "chat" else "/v1/completions"
        # The adapter is the line's model, as on the plain path; one to load (lora_modules) is loaded before
        # the file that holds its lines is uploaded (`upload_batch_file`).
        model = model_for(self.model, request)
        if request.adapter is not None:
            self._batch_adapters.add(request.adapter)
        body = completion_payload(model, request, vllm=self.server == "vllm", cache_key=self._cache_key)
        line = {"custom_id": custom_id, "method": "POST", "url": url, "body": body}
        data = json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode()
        return BatchLine(url, data)

    async def upload_batch_file(self, lines: Sequence[BatchLine]) -> str:
        """``POST /files`` (multipart, ``purpose=batch``); returns the file id."""
        self._check_open()
        # Each adapter named by the lines cut so far, loaded once (most are already: a no-op then).
        for name in sorted(self._batch_adapters):
            await self.adapters.ensure_loaded(name, None, self._listed)
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        content = b"".join(line.data + b"\n" for line in lines)
        form.add_field(
            "file", content, filename="asyncbackends-batch.jsonl", content_type="application/jsonl"
        )
        # Through the transport: a connection slot, its timeout, and aclose() ends it like any request.
        answer = await self._http.request("POST", self._api + "/files", form=form)
        return str(self._object(answer, "file")["id"])

    async def create_batch(self, file_id: str, endpoint: str) -> str:
        """``POST /batches`` over ``file_id``; returns the batch id."""
        self._check_open()
        body = {
            "input_file_id": file_id,
            "endpoint": endpoint,
            "completion_window": "24h",
            "metadata": {"created_by": "asyncbackends"},
        }
        resp = await self._http.request("POST", self._api + "/batches", json_body=body)
        return str(self._object(resp, "batch")["id"])

    async def find_batch(self, file_id: str) -> str | None:
        """The batch whose ``input_file_id`` is ``file_id``, from ``GET /batches`` (newest first, paged)."""
        self._check_open()
        after = ""
        for _ in range(_MAX_LIST_PAGES):
            query = "?limit=100" + (f"&after={after}" if after else "")
            page = self._object(await self._http.request("GET", self._api + "/batches" + query), "list")
            for batch in page.get("data") or ():
                if isinstance(batch, Mapping) and batch.get("input_file_id") == file_id:
                    return str(batch["id"])
            after = str(page.get("last_id") or "")
            if not page.get("has_more") or not after:
                return None
        return None

    async def poll_batch(self, batch_id: str) -> BatchStatus:
        """``GET /batches/{id}``."""
        self._check_open()
        batch = self._object(await self._http.request("GET", f"{self._api}/batches/{batch_id}"), "batch")
        counts = batch.get("request_counts") or {}
        status = str(batch.get("status"))
        return BatchStatus(
            id=batch_id,
            status=status,
            done=status in _FINISHED,
            completed=int(counts.get("completed") or 0),
            failed=int(counts.get("failed") or 0),
            total=int(counts.get("total") or 0),
            detail=batch,
        )

    async def cancel_batch(self, batch_id: str) -> None:
        """``POST /batches/{id}/cancel``."""
        self._check_open()
        self._object(await self._http.request("POST", f"{self._api}/batches/{batch_id}/cancel"), "batch")

    async def batch_outcomes(
        self, status: BatchStatus, requests: Mapping[str, GenerationRequest]
    ) -> dict[str, GenerationResult | BackendError]:
        """Each request's result or error from the batch's output and error files."""
        self._check_open()
        batch = status.detail
        if status.status == "failed":
            errors = (batch.get("errors") or {}).get("data") or []
            said = "; ".join(
                (f"line {e.get('line')}: " if e.get("line") is not None else "") + str(e.get("message"))
                for e in errors
                if isinstance(e, Mapping)
            )
            message = f"batch {status.id} failed: {said or 'the provider gave no reason'}"
            return {c: RequestRejectedError(message, backend=self.name) for c in requests}
        outcomes: dict[str, GenerationResult | BackendError] = {}
        for file_key in ("output_file_id", "error_file_id"):
            file_id = batch.get(file_key)
            if not file_id:
                continue
            resp = await self._http.request("GET", f"{self._api}/files/{file_id}/content")
            if resp.status >= 300:
                self._json(resp, None)  # raises the mapped error
            for raw in resp.body.splitlines():
                try:
                    line = json.loads(raw)
                    request = requests.get(line["custom_id"])
                except (ValueError, KeyError, TypeError):
                    continue  # an unreadable line: its request ends "without an answer"
                if request is not None:
                    outcomes[line["custom_id"]] = self._line_outcome(line, request)
        return outcomes

    def _line_outcome(
        self, line: Mapping[str, Any], request: GenerationRequest
    ) -> GenerationResult | BackendError:
        rid = request.request_id
        response = line.get("response")
        try:
            if isinstance(response, Mapping):
                raw = json.dumps(response.get("body"), separators=(",", ":")).encode()
                body = self._json(HTTPResponse(int(response["status_code"]), {}, raw), rid)
                return self._result(request, body)
            error = line.get("error") or {}
            code, message = error.get("code"), error.get("message") or "no message"
        except BackendError as exc:
            return exc
        except (KeyError, TypeError, ValueError) as exc:
            return BackendError(f"malformed batch output line: {exc}", backend=self.name, request_id=rid)
        text = f"batch line error {code}: {message}"
        if code == "batch_expired":
            return BackendTimeoutError(text, backend=self.name, request_id=rid)
        return BackendError(text, backend=self.name, request_id=rid)

    def _object(self, resp: HTTPResponse, kind: str) -> Mapping[str, Any]:
        body = self._json(resp, None)
        if not isinstance(body, Mapping) or (kind != "list" and "id" not in body):
            raise BackendError(
                f"malformed {kind} object from {self._api}: {str(body)[:200]}", backend=self.name
            )
        return body
