"""`OpenAIBackend` (name ``openai``): any server that speaks the OpenAI HTTP API.

``vllm serve``, TGI's Messages API, SGLang, llama.cpp's server and hosted providers. Text and token-id prompts
go to ``POST {base_url}/completions``, chat prompts to ``POST {base_url}/chat/completions``; ``n``, ``seed``,
``stop`` and ``logprobs`` map onto the request fields of the same names, usage onto ``prompt_tokens``.

`create` reads ``GET {base_url}/models`` once: with ``model=None`` it takes the only model served (or asks
you to choose), and it recognises a vLLM server by the ``owned_by: "vllm"`` its model list reports. A vLLM
server unlocks what the plain OpenAI API cannot do exactly:

- loglikelihoods: context and continuation are tokenized by the server's ``POST /tokenize`` (at the
  server root, beside ``/v1``) and split on token ids exactly as the in-process ``vllm`` adapter splits them
  (`_scoring`); the token-id prompt is then sent to ``/completions`` with ``echo: true``,
  ``max_tokens: 0``, ``logprobs: 1`` and ``return_tokens_as_token_ids: true``, so each echoed prompt token
  comes back with its logprob and the top-1 alternative (which says whether it is greedy);
- generated token ids (``return_token_ids``) and ``top_k``.

How a generation is asked for is `_http.delivery`'s choice, the same for every HTTP adapter. Under an idle
limit it is sent with ``stream: true`` (``stream_options.include_usage``) and the chunks put back into the
answer sent whole, so ``ab.Timeouts.idle`` bounds each wait for a token rather than the whole generation. A
vLLM server's chats and its requests offering tools are sent whole instead (its reasoning and tool parsers
split a streamed answer otherwise than a whole one on some outputs; the whole split is the in-process
``vllm`` adapter's), the idle limit kept by the server's ``GET /health`` (`HealthWatch`). Another server's
requests offering tools are streamed all the same (the OpenAI API has no health route to watch them by):
their tool calls are assembled from the chunks by index. Without an idle limit every answer is asked whole.
Scoring requests are short and bounded by the idle limit as a whole. A
length refusal (OpenAI's ``context_length_exceeded``, vLLM serve's "maximum context length") is a
`ContextLengthError`.

LoRA adapters (`_lora`): a request's ``adapter`` is the body's ``model`` on every route, as ``vllm serve
--lora-modules`` serves them; ``lora_modules`` makes the backend load each on its first use and refuse
unknown names before sending.

Any other server gets the plain OpenAI fields only, and loglikelihood requests are refused: without an
exact tokenizer a context/continuation split on text would score the wrong tokens. Errors are mapped by
`_http.error_for_status` (400/404/422 -> `RequestRejectedError`, 401/403 -> `AuthenticationError`, 429 ->
`RateLimitedError` with ``Retry-After``, 5xx -> retryable); a 429 that says the account is out of quota is
a rejection, since retrying cannot help.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from ..._batch import BatchLimits
from ..._protocol import BaseBackend, Secret
from ..._refusals import refuse_unclaimed_chat, refuse_unsupported
from ..._types import (
    Completion,
    GenerationRequest,
    GenerationResult,
)
from ...errors import AuthenticationError, BackendError, InvalidRequestError, RequestRejectedError
from .._http.credentials import split_url_credentials
from .._http.delivery import ask
from .._http.health_watch import HealthWatch
from .._http.streams import assemble_openai, sse_events, stream_error
from .._http.transport import (
    HTTPResponse,
    HTTPTransport,
    error_for_status,
    json_body,
    malformed_response,
    poll_until_ok,
)
from ._batch import OpenAIBatches
from ._lora import ServerAdapters, adapter_rejection, listed_names, model_for
from ._scoring import VLLMServerScoring
from ._wire import (
    VLLM_SERVER_ONLY,
    cached_prompt_tokens,
    capabilities,
    completion_payload,
    parse_completions,
    sends_prompt_cache_key,
)

__all__ = ["OpenAIBackend"]

ServerKind = Literal["auto", "vllm", "generic"]
_NOT_VLLM = dict.fromkeys(
    VLLM_SERVER_ONLY,
    "vLLM's extra request field; this server was not recognised as vLLM (pass server='vllm' if it is)",
)


class OpenAIBackend(OpenAIBatches, VLLMServerScoring, BaseBackend):
    """Talks to one OpenAI-compatible server. Build it with `create` (``ab.create_backend("openai", ...)``).

    Args:
        base_url: The API root including ``/v1``, as in the OpenAI SDK (``http://localhost:8000/v1``).
        model: The model name sent with every request.
        api_key: Sent as ``Authorization: Bearer ...``; an empty `Secret` sends none.
        server: ``"vllm"`` to use vLLM's extensions (tokenize, token ids, echo scoring), ``"generic"`` not to.
        max_model_len: The model's context length, where the server reported it.
        timeout: Seconds one HTTP request may take; ``None`` for no limit.
        headers: Extra headers for every request (credential-like ones, ``X-API-Key``..., held masked).
        max_connections: How many HTTP exchanges run at once (0 for unlimited); the wait for one is
            not timed by `gather`'s per-attempt timeout.
        max_concurrency: The concurrency `gather` uses when given none.
        images: Claim `Capabilities.images` (image parts sent as they are); false for a text-only model.
        tools: Claim `Capabilities.tools`; false for a server without tool calling (vLLM started without
            ``--enable-auto-tool-choice --tool-call-parser``), so tool requests are refused before sending.
        batch_limits: How ``batch=True`` runs cut and poll batches (OpenAI's limits by default).
        adapters: The LoRA adapters given as ``lora_modules`` (`ServerAdapters`); ``None``: none given,
            any adapter name is sent as the request's ``model`` and the server decides.
    """

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: Secret | None = None,
        server: Literal["vllm", "generic"] = "generic",
        max_model_len: int | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 256,
        max_concurrency: int | None = None,
        images: bool = True,
        tools: bool = True,
        batch_limits: BatchLimits | None = None,
        adapters: ServerAdapters | None = None,
    ) -> None:
        if not isinstance(base_url, str):
            raise InvalidRequestError(f"base_url must be a str, got {type(base_url).__name__}")
        # Shown and fingerprinted without user:password@ (the transport sends those as a masked header).
        self.base_url = split_url_credentials(base_url)[0].rstrip("/")
        full = base_url.rstrip("/")
        # The transport is rooted at the server, not at /v1: vLLM's /tokenize and /health live there.
        root, self._api = (full[:-3], "/v1") if full.endswith("/v1") else (full, "")
        self._http = HTTPTransport(
            root or full,
            backend=self.name,
            token=api_key,
            headers=headers,
            timeout=timeout,
            max_connections=max_connections,
        )
        self.model = model
        self.server = server
        self.max_model_len = max_model_len
        self.model_root: str | None = None  # what the served name points at (vLLM's `root`), where listed
        self._special: tuple[tuple[int, ...], int | None] | None = None  # (BOS prefix, empty-context token)
        self._special_lock: asyncio.Lock | None = None
        self._claims = {"images": bool(images), "tools": bool(tools)}
        self.capabilities = capabilities(server, max_concurrency, **self._claims)
        self.batch_limits = batch_limits or BatchLimits()
        self._health = HealthWatch(self._http)
        self._cache_key = sends_prompt_cache_key(self.base_url)  # few-shot prompts share OpenAI's cache
        self._batch_adapters: set[str] = set()
        self.adapters = adapters or ServerAdapters(
            None, self._http, self._api, backend=self.name, where=self.base_url
        )

    @classmethod
    async def create(
        cls,
        *,
        base_url: str,
        api_key: str | Secret | None = None,
        model: str | None = None,
        server: ServerKind = "auto",
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 256,
        max_concurrency: int | None = None,
        images: bool = True,
        tools: bool = True,
        batch_max_requests: int = 50_000,
        batch_max_bytes: int = 200 * 1024 * 1024,
        batch_poll_interval: float = 30.0,
        lora_modules: Mapping[str, str | os.PathLike[str]] | None = None,
    ) -> OpenAIBackend:
        """Build the backend, reading ``GET {base_url}/models`` to pick the model and recognise vLLM.

        Args:
            base_url: The API root including ``/v1`` (``http://localhost:8000/v1``).
            api_key: The API key; ``None`` reads ``$OPENAI_API_KEY`` (none sent when that is unset too).
            model: The model to ask for; ``None`` takes the only one the server lists.
            server: ``"auto"`` (vLLM when its model list says ``owned_by: "vllm"``), ``"vllm"`` or
                ``"generic"`` (plain OpenAI fields only; no loglikelihood).
            timeout: Seconds one HTTP request may take; ``None`` for no limit.
            headers: Extra headers for every request (credential-like ones, ``X-API-Key``..., held masked).
            max_connections: How many HTTP exchanges run at once (0 for unlimited); the wait for one is
            not timed by `gather`'s per-attempt timeout.
            max_concurrency: The concurrency `gather` uses when given none.
            images: Claim image parts (false for a text-only model).
            tools: Claim tools (false for a server without tool calling).
            batch_max_requests: Most requests in one provider batch (``batch=True`` runs; OpenAI: 50,000).
            batch_max_bytes: Most bytes in one batch's input file (OpenAI: 200 MB).
            batch_poll_interval: Seconds between two looks at a batch in flight.
            lora_modules: LoRA adapters by name (``{"math": "/ckpt/math"}``, as ``vllm serve
                --lora-modules``): each is loaded on the server on its first use (``POST
                /v1/load_lora_adapter``) unless it already serves it, a name outside them is refused before
                sending, and the fingerprint holds the SHA-256 of each one's files. Without it an adapter
                name is sent as it is (the server's ``--lora-modules``).

        Raises:
            InvalidRequestError: ``model=None`` and the server lists no model or several (they are named),
                or an option is invalid (``lora_modules`` not a mapping of names to adapter directories).
            BackendError: The model list could not be read while it was needed (``model=None``).
        """
        if server not in ("auto", "vllm", "generic"):
            raise InvalidRequestError(f"server must be 'auto', 'vllm' or 'generic', got {server!r}")
        if model is not None and (not isinstance(model, str) or not model):
            raise InvalidRequestError(f"model must be a non-empty str or None, got {model!r}")
        if api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY") or ""
        secret = api_key if isinstance(api_key, Secret) else Secret(api_key)
        limits = BatchLimits(batch_max_requests, batch_max_bytes, batch_poll_interval)
        backend = cls(
            batch_limits=limits,
            base_url=base_url,
            model=model or "",
            api_key=secret,
            timeout=timeout,
            headers=headers,
            max_connections=max_connections,
            max_concurrency=max_concurrency,
            images=images,
            tools=tools,
        )
        try:
            if lora_modules is not None:
                backend.adapters = await ServerAdapters.read(
                    lora_modules, backend._http, backend._api, backend=cls.name, where=backend.base_url
                )
            await backend._discover(model, server)
        except BaseException:
            await backend.aclose()
            raise
        return backend

    async def _discover(self, model: str | None, server: ServerKind) -> None:
        try:
            listed = await self._models()
        except BackendError as exc:
            # A provider that hides its model list, or a server not up yet: a given model is taken on trust
            # (requests fail, retryably, until it answers), but then nothing says the server is vLLM: pass
            # server="vllm" to score on a server that may still be starting. A bad key fails here and now.
            if model is None or isinstance(exc, AuthenticationError):
                raise
            listed = []
        if model is None:
            # vLLM lists each LoRA module too, with its base as `parent`: the base is the one to choose.
            ids = [str(entry.get("id")) for entry in listed if not entry.get("parent")]
            if len(ids) != 1:
                raise InvalidRequestError(
                    f"{self.base_url} serves {len(ids)} models; choose one with model=: {', '.join(ids)}"
                    if ids
                    else f"{self.base_url}/models lists no model; pass model="
                )
            model = ids[0]
        self.model = model
        entry = next((e for e in listed if e.get("id") == model), {})
        root = entry.get("root")
        self.model_root = root if isinstance(root, str) and root else None
        length = entry.get("max_model_len")
        self.max_model_len = length if isinstance(length, int) and length > 1 else None
        if server == "auto":
            server = "vllm" if any(e.get("owned_by") == "vllm" for e in listed) else "generic"
        self.server = server
        self.capabilities = capabilities(server, self.capabilities.max_concurrency, **self._claims)

    async def _models(self) -> list[Mapping[str, Any]]:
        body = self._json(await self._http.request("GET", self._api + "/models"), None)
        try:
            return [e for e in body["data"] if isinstance(e, Mapping)]
        except (KeyError, TypeError) as exc:
            raise self._malformed(None, exc) from exc

    def __repr__(self) -> str:
        return f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r}, server={self.server!r})"

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What decides this backend's outputs, for the response cache (no credential in it).

        The server, the model asked for and the model it serves under that name: vLLM lists the model a
        served name points at as ``root`` (``--served-model-name`` aliases), so a server redeployed with
        other weights under the same name gets other keys. ``server`` is there because a vLLM server's
        answers carry more (token ids) than a generic server's. All of it is read by `create`, before the
        first request. With ``lora_modules``, each adapter's name and the SHA-256 of its files.
        """
        return {
            "name": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "model_root": self.model_root,
            "server": self.server,
            # Only where lora_modules were given: older cache files keep their keys. Without them a
            # request's adapter name is in its own key (the core's request key), its weights unknown here.
            **self.adapters.fingerprint,
        }

    async def check_ready(self) -> None:
        """One ``GET /v1/models``: returns when the server lists its models (a pool's readiness probe).

        Raises:
            BackendError: The mapped error of a failed answer or connection.
        """
        self._check_open()
        await self._models()

    async def _aclose(self) -> None:
        await self._health.aclose()
        await self._http.aclose()

    async def wait_until_ready(self, timeout: float = 300.0, interval: float = 0.5, path: str = "") -> None:
        """Poll ``GET path`` (``{base_url}/models`` by default) until it answers 200.

        Raises:
            BackendTimeoutError: Not ready within ``timeout`` seconds.
        """
        self._check_open()
        path = path or self._api + "/models"
        await poll_until_ok(self._http, path, timeout=timeout, interval=interval, what=self.base_url)

    # -- generate ------------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """One request: ``/completions`` for text and token ids, ``/chat/completions`` for chat."""
        rid = request.request_id
        self._check_open(rid)
        params = request.params
        self._refuse(request)
        if params.max_tokens == 0:
            # OpenAI-compatible servers refuse max_tokens=0 without echo; the answer is known anyway.
            empty = tuple(
                Completion("", (), () if params.logprobs else None, "length") for _ in range(params.n)
            )
            return GenerationResult(rid, empty, None, self.model)
        chat = request.prompt_kind == "chat"
        if params.reasoning_effort is not None and not chat:
            raise RequestRejectedError(
                "openai: reasoning_effort is a chat completions field; send a chat prompt",
                backend=self.name,
                request_id=rid,
            )
        await self.adapters.ensure_loaded(request.adapter, rid, self._listed)
        payload = completion_payload(
            model_for(self.model, request), request, vllm=self.server == "vllm", cache_key=self._cache_key
        )
        path = "/chat/completions" if chat else "/completions"
        vllm = self.server == "vllm"
        ask_server = ask(
            whole=lambda: self._post(path, payload, rid),
            streamed=lambda idle: self._streamed(path, payload, rid, chat=chat, idle=idle),
            # A server parser's streamed split may differ from the whole answer's: tools anywhere, and
            # vLLM's reasoning parsers on its chats. A vLLM server is then watched by its GET /health; a
            # generic one has no health route, and is streamed all the same (its tool calls assembled).
            streams_exactly=not request.tools and not (chat and vllm),
            watch=self._health if vllm else None,
            backend=self.name,
            request_id=rid,
        )
        try:
            body = await ask_server
        except BackendError as exc:
            raise adapter_rejection(exc, request, self.base_url) from exc
        return self._result(request, body)

    def _refuse(self, request: GenerationRequest) -> None:
        """Refuse what this server cannot honour, before anything is sent (plain and batch paths)."""
        rid = request.request_id
        refuse_unsupported(
            request.params, self.capabilities, backend=self.name, request_id=rid, reasons=_NOT_VLLM
        )
        refuse_unclaimed_chat(request, self.capabilities, backend=self.name)
        self.adapters.refuse_unknown(request)

    async def _listed(self) -> set[str]:
        """The model names the server lists now (an adapter already served needs no loading)."""
        return listed_names(await self._models())

    def _result(self, request: GenerationRequest, body: Any) -> GenerationResult:
        """A completions answer's body as the request's result (plain and batch paths)."""
        rid, params = request.request_id, request.params
        chat = request.prompt_kind == "chat"
        try:
            completions, prompt_tokens, generated, model = parse_completions(
                body, chat=chat, logprobs=params.logprobs
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise self._malformed(rid, exc) from exc
        if len(completions) != params.n:
            raise BackendError(
                f"the server returned {len(completions)} completions for n={params.n}",
                backend=self.name,
                request_id=rid,
                retryable=False,
            )
        cached = cached_prompt_tokens(body)
        return GenerationResult(rid, completions, prompt_tokens, model or self.model, generated, cached)

    # -- wire ----------------------------------------------------------------------------------------

    async def _streamed(
        self, path: str, payload: dict[str, Any], rid: str | None, *, chat: bool, idle: float
    ) -> Any:
        """``payload`` sent with ``stream: true``, its chunks assembled into the answer sent whole.

        Streamed so that the idle limit (``ab.Timeouts.idle``) bounds each wait for a token rather than the
        whole generation; the chunks are put back into the non-streamed body (`assemble_openai`),
        which is parsed as usual.
        """
        payload = {**payload, "stream": True, "stream_options": {"include_usage": True}}
        resp = await self._http.request(
            "POST", self._api + path, json_body=payload, request_id=rid, idle=idle
        )
        if resp.status >= 300 or "text/event-stream" not in resp.headers.get("Content-Type", ""):
            return self._json(resp, rid)  # an error, or a server that answered whole all the same
        try:
            chunks = sse_events(resp.body)
            failed = stream_error(chunks)
            body = None if failed is not None else assemble_openai(chunks, chat=chat)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
            raise self._malformed(rid, exc) from exc
        if failed is not None:
            # A failure after the stream began (vLLM sends one error chunk): its code is the status.
            error = failed["error"]
            code = error.get("code") if isinstance(error, Mapping) else None
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            raise error_for_status(status, json.dumps(failed), backend=self.name, request_id=rid)
        return body

    async def _post(self, path: str, payload: Any, rid: str | None, idle: float | None = None) -> Any:
        return self._json(
            await self._http.request("POST", self._api + path, json_body=payload, request_id=rid, idle=idle),
            rid,
        )

    def _json(self, resp: HTTPResponse, rid: str | None) -> Any:
        if resp.status == 429 and b"insufficient_quota" in resp.body:
            # OpenAI's "out of credit" is a 429 too, but no amount of waiting fixes it.
            error = error_for_status(resp.status, resp.body, resp.headers, backend=self.name, request_id=rid)
            raise RequestRejectedError(error.message, backend=self.name, request_id=rid)
        return json_body(resp, wire="OpenAI-compatible", backend=self.name, request_id=rid)

    def _malformed(self, rid: str | None, exc: BaseException) -> BackendError:
        return malformed_response("OpenAI-compatible", exc, backend=self.name, request_id=rid)
