"""LoRA adapters on an OpenAI-compatible server, for the ``openai`` adapter.

``vllm serve --enable-lora --lora-modules name=path`` serves each adapter as a model of its own: a request
names one by its ``model`` field (`model_for`), on every route (completions, chat, the echo scoring, the
Batch API's lines). Without ``lora_modules`` the backend sends any name it is given, and the server decides:
vLLM answers an unknown one with ``404 NotFoundError`` ("The model `x` does not exist."), a non-retried
`RequestRejectedError` that names the adapter (`adapter_rejection`).

With ``lora_modules={"name": "/path"}`` the backend knows its adapters: an unknown name is refused before
sending, and each is loaded on its first use through vLLM's ``POST /v1/load_lora_adapter``
(``{"lora_name", "lora_path"}``; the route exists only on a server started with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), once per name however many requests wait for it. A name the
server already lists (``--lora-modules``, an earlier run) is not loaded again; vLLM's 400 "has already been
loaded" (another client loaded it meanwhile) counts as loaded. The fingerprint then holds each name and the
SHA-256 of its files (the ``vllm`` adapter's `read_lora_modules`, the same digest), so a cache never serves
one checkpoint's answers for another saved under the same name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..._refusals import refuse_unknown_adapter
from ..._types import Request
from ...errors import BackendError, RequestRejectedError
from .._http.transport import HTTPTransport, error_for_status, error_message
from .._lora_dirs import LoraModules, read_lora_modules

__all__ = ["ServerAdapters", "adapter_rejection", "model_for"]


def model_for(base: str, request: Request) -> str:
    """The ``model`` field of ``request``'s body: its adapter's name, or the base model's."""
    return request.adapter if request.adapter is not None else base


def adapter_rejection(error: BackendError, request: Request, where: str) -> BackendError:
    """``error`` naming the request's adapter where it is the server's 404 for an unknown model name.

    vLLM's 404 says "The model `x` does not exist" and names only its base models as valid: the message
    says which adapter was asked and how a server serves one. Still a `RequestRejectedError` (not retried).
    """
    if request.adapter is None or not isinstance(error, RequestRejectedError) or "HTTP 404" not in str(error):
        return error
    return RequestRejectedError(
        f"{where} does not serve adapter {request.adapter!r} ({error.message}); start it with "
        "--enable-lora --lora-modules NAME=PATH, or give the backend lora_modules= to load it",
        backend=error.backend,
        request_id=error.request_id,
    )


class ServerAdapters:
    """The adapters a backend was given (``lora_modules``) and the ones loaded on its server so far.

    Args:
        modules: The adapters, read and checked by `read_lora_modules` (``None``: none given).
        http: The backend's transport (rooted at the server, not at ``/v1``).
        api: The API prefix (``"/v1"``).
        backend: The backend's name, for errors.
        where: The server's URL, for errors.
    """

    def __init__(
        self, modules: LoraModules | None, http: HTTPTransport, api: str, *, backend: str, where: str
    ) -> None:
        self.modules = modules
        self._http, self._api, self._backend, self._where = http, api, backend, where
        self._loaded: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._refused: dict[str, BackendError] = {}  # names whose load failed for good (not retryable)
        self.loads = 0  # POST /v1/load_lora_adapter sent (tests, logs)

    @classmethod
    async def read(
        cls, lora_modules: Any, http: HTTPTransport, api: str, *, backend: str, where: str
    ) -> ServerAdapters:
        """`ServerAdapters` over ``lora_modules`` (each adapter's files read in a thread, not on the loop).

        Raises:
            InvalidRequestError: ``lora_modules`` is not a mapping of names to adapter directories.
        """
        modules = await asyncio.to_thread(read_lora_modules, lora_modules)
        return cls(modules, http, api, backend=backend, where=where)

    @property
    def fingerprint(self) -> dict[str, Any]:
        """``{"lora_modules": {name: "sha256:<hex>"}}``, or nothing where none were given."""
        return self.modules.fingerprint if self.modules is not None else {}

    def refuse_unknown(self, request: Request) -> None:
        """Refuse a request naming an adapter outside ``lora_modules`` (where they were given)."""
        if self.modules is not None:
            refuse_unknown_adapter(request, self.modules.names, backend=self._backend)

    async def ensure_loaded(self, name: str | None, rid: str | None, listed: Any) -> None:
        """Load adapter ``name`` on the server if this backend has not yet; once per name.

        Args:
            name: The adapter a request names (``None``: the base, nothing to load).
            rid: The request's id, for errors.
            listed: An async callable returning the model names the server lists (``GET /v1/models``).

        Raises:
            RequestRejectedError: The server has no runtime loading, or refused to load the adapter.
            BackendError: The server failed while loading it (retryable where its status says so).
        """
        if self.modules is None or name is None or name in self._loaded:
            return
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:  # one load per name: the others wait for it, then find it loaded (or refused)
            if name in self._loaded:
                return
            refused = self._refused.get(name)
            if refused is not None:
                # A load the server refused is not asked again by every request that waited for it.
                raise RequestRejectedError(refused.message, backend=self._backend, request_id=rid)
            try:
                if name not in await listed():
                    await self._load(name, self.modules.by_name[name].path, rid)
            except BackendError as exc:
                if not exc.retryable:
                    self._refused[name] = exc
                raise
            self._loaded.add(name)

    async def _load(self, name: str, path: str, rid: str | None) -> None:
        self.loads += 1
        resp = await self._http.request(
            "POST",
            self._api + "/load_lora_adapter",
            json_body={"lora_name": name, "lora_path": path},
            request_id=rid,
        )
        if resp.status < 300:
            return
        text = error_message(resp.body)
        if resp.status == 400 and "has already been loaded" in text:
            return  # loaded by another client since the model list was read: the same name, served
        if resp.status in (404, 405) and "lora" not in text.lower():
            # FastAPI's {"detail": "Not Found"}: the route is registered only with runtime updating on.
            raise RequestRejectedError(
                f"{self._where} cannot load adapter {name!r}: it has no /v1/load_lora_adapter route (start "
                "vllm serve with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, or serve it with --lora-modules)",
                backend=self._backend,
                request_id=rid,
            )
        error = error_for_status(resp.status, resp.body, resp.headers, backend=self._backend, request_id=rid)
        # The mapped error keeps its kind (a 5xx stays retryable, a 429 keeps its Retry-After), named.
        error.message = f"{self._where} could not load adapter {name!r} from {path!r}: {error.message}"
        error.args = (error.message,)
        raise error


def listed_names(models: list[Mapping[str, Any]]) -> set[str]:
    """The model ids of a ``GET /v1/models`` answer's entries."""
    return {str(entry.get("id")) for entry in models}
