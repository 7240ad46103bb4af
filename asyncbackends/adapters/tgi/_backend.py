"""`TGIBackend` (name ``tgi``): Hugging Face text-generation-inference over its native HTTP API.

One request per call, like every adapter; a request may take several HTTP exchanges inside that call (n > 1,
and loglikelihood's ``/tokenize``), made concurrently and failing together. Text prompts go to
``POST /generate`` as they are, images in TGI's markdown form (``![](data:...)``, ``![](https://...)``)
included; chat prompts (with their images and tools) to ``POST /v1/chat/completions`` (TGI's Messages API);
any body over ``payload_limit`` is refused before sending. Loglikelihoods read the prefill logprobs of
``/generate`` with ``decoder_input_details``. `SamplingParams` are mapped as TGI's router accepts them:

- greedy is ``do_sample: false`` with no temperature, top_k or top_p at all: TGI rejects temperature <= 0,
  and its server turns sampling on whenever a warper (top_k, top_p < 1, temperature != 1) is present;
- sampling is ``do_sample: true`` plus the temperature, ``top_k`` when set and ``top_p`` when below 1
  (TGI requires 0 < top_p < 1);
- ``return_full_text: false`` always (TGI may echo the prompt otherwise) and ``details: true``;
- the optional parameters TGI has are sent under its names (the table's ``tgi`` and ``tgi_chat`` names,
  `asyncbackends._sampling_table`); one its chat route has no field for is refused for chat prompts
  (`NOT_ON_CHAT`). ``json_schema`` and ``regex`` are its ``grammar`` ``{"type": "json" | "regex", "value":
  ...}`` (``response_format`` on the chat route). The rest have no TGI equivalent and are refused
  (`UNSUPPORTED_REASONS`; TGI's chat ``presence_penalty`` is turned into a repetition penalty by its router,
  so it is not used);
- TGI has no ``n``: n > 1 becomes n concurrent requests with seeds ``seed + i`` inside this one call,
  cancelled together when one fails; TGI's ``best_of`` is not used (it returns one sequence, not n).

LoRA adapters: with ``adapters`` (the launcher's ``--lora-adapters`` ids) a request's ``adapter`` is sent as
``parameters.adapter_id`` (the chat route's ``model``), and a name outside them is refused before sending:
TGI answers an unknown ``adapter_id`` from the base model.

``GET /info`` is read once, when the backend is built (`create`) or else before the first request: the model
it names keys the response cache, and requests TGI would refuse for their length are refused here before
sending (`ContextLengthError` when prompt plus ``max_tokens`` exceed ``max_total_tokens``). How a generation
is asked for is `_http.delivery`'s choice, the same for every HTTP adapter. Under an idle limit, text prompts
are generated through ``POST /generate_stream`` and the events put back into ``/generate``'s answer
(`_http.streams`), so ``ab.Timeouts.idle`` bounds each wait for a token, not the whole generation; chat
prompts are asked whole (TGI's streamed chat, its tool calls above all, is not its whole answer in pieces)
and the idle limit is kept by TGI's ``GET /health`` (`HealthWatch`: no sign of life for ``idle`` seconds
abandons the answer, retryably). Without an idle limit every answer is asked whole. ``/info``, scoring and
tokenizing are short and bounded by the idle limit as a whole. Errors are mapped by
`_http.error_for_status`: 422 -> `RequestRejectedError` (a length error: `ContextLengthError`), 429 ->
`RateLimitedError`, 503 -> `BackendUnavailableError`, 424 and other 5xx -> retryable `BackendError`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ..._protocol import BaseBackend, Secret
from ..._refusals import refuse_unknown_adapter
from ..._tasks import all_or_nothing
from ..._text import split_trailing_space
from ..._timeouts import idle_timeout
from ..._types import (
    Capabilities,
    Completion,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Request,
)
from ...errors import (
    AuthenticationError,
    BackendError,
    ContextLengthError,
    InvalidRequestError,
    RequestRejectedError,
)
from .._http.credentials import resolve_token
from .._http.delivery import ask
from .._http.health_watch import HealthWatch
from .._http.streams import assemble_generate, sse_events, stream_error
from .._http.transport import (
    HTTPResponse,
    HTTPTransport,
    error_for_status,
    json_body,
    malformed_response,
    poll_until_ok,
)
from .._reasoning_tags import check_reasoning_tags, split_by_tags, without_stops
from ._checks import check_adapters, continuation_logprobs, refuse_for_info, refuse_generation
from ._wire import (
    DEFAULT_PAYLOAD_LIMIT,
    HONOURED,
    adapter_fields,
    chat_payload,
    encoder,
    generate_payload,
    int_header,
    length_problem,
    oversized,
    parse_chat,
    parse_generate,
)
from ._wire import (
    TGIInfo as TGIInfo,
)

__all__ = ["TGIBackend"]

T = TypeVar("T")
# One call's completion, prompt tokens and generated tokens (each count None where the server gave none).
_Once = tuple[Completion, int | None, int | None]
log = logging.getLogger(__name__)
# The status a streamed route would have answered for each of TGI's error types (its OpenAPI spec).
_STREAM_ERROR_STATUS = {"validation": 422, "overloaded": 429, "generation": 424, "incomplete_generation": 500}
# How long building waits for /info before leaving it to the first request.
_BUILD_INFO_TIMEOUT = 3.0


class TGIBackend(BaseBackend):
    """Talks to one text-generation-inference server.

    Args:
        url: The server root, for example ``http://localhost:8080`` (not ``.../v1``). Credentials in it
            (``https://user:key@host``) are sent as HTTP Basic auth and never shown.
        token: Bearer token, always sent; ``None`` uses the one huggingface_hub finds (``HF_TOKEN``, the saved
            login) but only for https URLs on Hugging Face hosts; ``False`` sends none.
        timeout: Seconds one HTTP request may take; ``None`` for no limit (``gather``'s ``timeout`` is
            the per-attempt limit you usually want).
        headers: Extra headers for every request; those whose name suggests a credential (``X-API-Key``...)
            are held masked, like the token.
        max_connections: How many HTTP exchanges run at once (0: unlimited). Requests beyond it wait for a
            connection, and that wait is not timed by `gather`'s per-attempt timeout.
        max_concurrency: The concurrency `gather` uses when given none.
        tokenizer: Optional local tokenizer (an object with ``encode(text) -> list[int]``, or a callable) to
            count tokens: loglikelihood continuations without ``POST /tokenize``, and prompt lengths checked
            against ``/info`` before sending (a markdown image counted as no tokens: a lower bound).
        payload_limit: The server's ``--payload-limit`` in bytes (TGI's default 2,000,000): a body over it
            (large images, as chat parts or a text prompt's markdown) is refused with `RequestRejectedError`
            before sending; ``None``: no check.
        reasoning_tags: ``(start, end)`` that delimit a reasoning model's thinking in the text the server
            returns (``("<think>", "</think>")``): the answer alone in ``text``, the thinking in
            ``reasoning``; stop strings end the answer only (`_reasoning_tags`).
        adapters: The LoRA adapter ids the server serves, as its launcher's ``--lora-adapters`` names
            them (a sequence of ids, or that option's string: ``"math,code=/ckpt/code"``). Requests naming
            one send it as ``adapter_id``; a name outside them is refused before sending, since TGI answers
            an unknown ``adapter_id`` from its base model without an error. ``None`` (the default): the
            backend claims no adapters (`Capabilities.adapters` false).
    """

    name = "tgi"

    def __init__(
        self,
        *,
        url: str,
        token: str | Secret | bool | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 256,
        max_concurrency: int | None = None,
        tokenizer: Any = None,
        payload_limit: int | None = DEFAULT_PAYLOAD_LIMIT,
        reasoning_tags: tuple[str, str] | None = None,
        adapters: Sequence[str] | str | None = None,
    ) -> None:
        self.adapters = check_adapters(adapters)
        secret = resolve_token(token, url=url if isinstance(url, str) else None)
        self._http = HTTPTransport(
            url,
            backend=self.name,
            token=secret,
            headers=headers,
            timeout=timeout,
            max_connections=max_connections,
        )
        self.url = self._http.base_url  # without any user:password@ (sent as a masked header instead)
        self._encode = encoder(tokenizer)
        if payload_limit is not None and (not isinstance(payload_limit, int) or payload_limit < 1):
            raise InvalidRequestError(f"payload_limit must be a positive int or None, got {payload_limit!r}")
        self.payload_limit = payload_limit
        self.reasoning_tags = check_reasoning_tags(reasoning_tags)
        self._info: TGIInfo | None = None
        self._unlearned = uuid.uuid4().hex  # the fingerprint's stand-in until /info has answered
        self._info_lock: asyncio.Lock | None = None
        self._health = HealthWatch(self._http, "/health")
        self.capabilities = Capabilities(
            loglikelihood=True,
            is_greedy=False,
            n_samples=True,
            seed=True,
            chat=True,
            logprobs=True,
            stop=True,
            max_concurrency=max_concurrency,
            **dict.fromkeys(HONOURED, True),
            images=True,
            tools=True,
            reasoning=self.reasoning_tags is not None,
            adapters=self.adapters is not None,
        )

    def __repr__(self) -> str:
        return f"TGIBackend(url={self.url!r})"

    @classmethod
    async def create(cls, **options: Any) -> TGIBackend:
        """Build the backend and read ``GET /info`` (the model served: the cache key) before any request.

        A server that does not answer yet (still starting), or not within 3 s, is not an error here:
        ``/info`` is then read before the first request is sent, and until it is the fingerprint matches no
        other backend's, so a response cache serves nothing from another model. (The bound also keeps a
        blocking ``create_backend`` from waiting on a server served by the calling thread's own loop.)

        Args:
            **options: The constructor's (`create_backend` checks them against its signature).

        Raises:
            AuthenticationError: The server refused the token.
            InvalidRequestError: An invalid option.
        """
        backend = cls(**options)
        try:
            await asyncio.wait_for(backend.info(), _BUILD_INFO_TIMEOUT)
        except AuthenticationError:
            await backend.aclose()
            raise
        except (BackendError, TimeoutError) as exc:
            log.debug("tgi %s: /info not read at build (%r); read before the first request", backend.url, exc)
        except BaseException:
            await backend.aclose()
            raise
        return backend

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What decides this backend's outputs, for the response cache: the server and the model it serves.

        The model is ``/info``'s ``model_id``, ``model_sha`` (the revision) and ``model_dtype``, so a server
        redeployed with another model at the same URL gets other cache keys. Before ``/info`` has answered,
        a key unique to this backend object stands in (nothing cached for another model can match it). A
        proxy that hides ``/info`` leaves only the URL to key by. No credential is part of it.
        """
        info = self._info
        if info is None:
            return {"name": self.name, "url": self.url, "model_id": None, "unlearned": self._unlearned}
        identity = {"model_id": info.model_id, "model_sha": info.model_sha, "model_dtype": info.model_dtype}
        split = {"reasoning_tags": list(self.reasoning_tags)} if self.reasoning_tags else {}  # text = answer
        return {"name": self.name, "url": self.url, **identity, **split}

    async def _aclose(self) -> None:
        await self._health.aclose()
        await self._http.aclose()

    # -- server metadata -----------------------------------------------------------------------------

    async def info(self, request_id: str | None = None) -> TGIInfo:
        """``GET /info``, read once and kept; a failed read is retried by the next call."""
        if self._info is not None:
            return self._info
        if self._info_lock is None:
            self._info_lock = asyncio.Lock()
        async with self._info_lock:
            if self._info is None:
                # Bounded by the idle limit as a whole, as every short request is.
                resp = await self._http.request("GET", "/info", request_id=request_id, idle=idle_timeout())
                if resp.status == 404:
                    self._info = TGIInfo()  # a proxy that hides /info: the server's own checks still apply
                else:
                    self._info = TGIInfo.from_json(self._json(resp, request_id))
        return self._info

    async def wait_until_ready(self, timeout: float = 300.0, interval: float = 0.5) -> None:
        """Poll ``GET /health`` until it answers 200, then read ``GET /info``.

        Raises:
            BackendTimeoutError: Not ready within ``timeout`` seconds.
            BackendClosedError: The backend was closed.
        """
        self._check_open()
        await poll_until_ok(self._http, "/health", timeout=timeout, interval=interval, what=self.url)
        await self.info()  # the model served, for the fingerprint, now that the server answers

    async def check_ready(self) -> None:
        """One ``GET /health``: returns when the server answers 200 (a pool's readiness probe).

        Raises:
            BackendError: The mapped error of any other answer, or of a failed connection.
        """
        from .._http.transport import error_for_status

        self._check_open()
        resp = await self._http.request("GET", "/health")
        if resp.status != 200:
            raise error_for_status(resp.status, resp.body, resp.headers, backend=self.name)

    # -- generate ------------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """One prompt; n > 1 fans out into n requests with seeds ``seed + i``."""
        rid = request.request_id
        self._check_open(rid)
        params = request.params
        refuse_generation(request, self.capabilities, backend=self.name)
        self._refuse_unknown_adapter(request)
        info = await self.info(rid)
        refuse_for_info(params, info)
        if request.prompt_kind == "chat":
            one = self._chat_once
        else:
            self._check_length(info, request.prompt, params.max_tokens, rid)  # type: ignore[arg-type]
            one = self._generate_once
        tags = self.reasoning_tags
        sent = request if tags is None else without_stops(request, self.name)  # stops end the answer only
        seeds = [None if params.seed is None else params.seed + i for i in range(params.n)]
        if params.n == 1:
            outs = [await one(sent, seeds[0])]
        else:
            outs = await all_or_nothing([one(sent, s) for s in seeds])
        got = tuple(c if tags is None else split_by_tags(c, tags, params.stop) for c, _, _ in outs)
        counted = [generated for _, _, generated in outs if generated is not None]
        return GenerationResult(
            rid,
            got,
            prompt_tokens=outs[0][1],
            model=info.model_id,
            generated_tokens=sum(counted) if len(counted) == len(outs) else None,
        )

    def _check_length(
        self, info: TGIInfo, text: str, max_new: int, rid: str | None, prompt_min: int = 1
    ) -> None:
        """Refuse what TGI's router would refuse for length; the prompt is counted only with a tokenizer."""
        problem = length_problem(info, text, max_new, self._encode, prompt_min)
        if problem:
            raise ContextLengthError(problem, backend=self.name, request_id=rid)

    async def _generate_once(self, request: GenerationRequest, seed: int | None) -> _Once:
        # /generate and /generate_stream give the same answer (the events assembled into /generate's), so
        # it is streamed whenever an idle limit applies: a long generation that keeps producing is never
        # cut. Without one, /generate costs the server and the client one body instead of an event a token
        # (0.6x a bare loop's throughput streamed, at 20 ms a request).
        rid = request.request_id
        payload = generate_payload(request, seed)
        body, headers = await ask(
            whole=lambda: self._post("/generate", payload, request),
            streamed=lambda idle: self._generate_streamed(payload, rid, idle),
            streams_exactly=True,
            watch=self._health,
            backend=self.name,
            request_id=rid,
        )
        try:
            completion = parse_generate(body, request.params)
            prompt_tokens = int_header(headers, "x-prompt-tokens") or body["details"]["input_length"]
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise self._malformed(rid, exc) from exc
        return completion, prompt_tokens, len(completion.token_ids)

    async def _generate_streamed(
        self, payload: Any, rid: str | None, idle: float
    ) -> tuple[Any, Mapping[str, str]]:
        """``/generate_stream``'s events assembled into ``/generate``'s answer, and the response headers."""
        resp = await self._send("/generate_stream", payload, rid, idle=idle)
        if resp.status >= 300:
            raise error_for_status(resp.status, resp.body, resp.headers, backend=self.name, request_id=rid)
        try:
            events = sse_events(resp.body)
            failed = stream_error(events)
            body = assemble_generate(events) if failed is None else None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise self._malformed(rid, exc) from exc
        if failed is not None:
            # A failure after the stream began: its error_type says what the status would have been.
            status = _STREAM_ERROR_STATUS.get(str(failed.get("error_type")), 500)
            raise error_for_status(status, json.dumps(failed), backend=self.name, request_id=rid)
        return body, resp.headers

    async def _chat_once(self, request: GenerationRequest, seed: int | None) -> _Once:
        # Asked whole: TGI's streamed chat (its tool calls above all) is not its whole answer cut in
        # pieces. Under an idle limit, TGI's GET /health keeps it (its shards answer it between steps).
        body, _ = await ask(
            whole=lambda: self._post("/v1/chat/completions", chat_payload(request, seed), request),
            streamed=None,
            streams_exactly=False,
            watch=self._health,
            backend=self.name,
            request_id=request.request_id,
        )
        try:
            completion, usage = parse_chat(body, request.params)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
            raise self._malformed(request.request_id, exc) from exc
        # The chat route gives no token ids: its usage is the only count of what it generated.
        return completion, usage.get("prompt_tokens"), usage.get("completion_tokens")

    # -- loglikelihood -------------------------------------------------------------------------------

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Sum of the continuation's prefill logprobs; ``is_greedy`` is ``None`` (TGI cannot tell)."""
        rid = request.request_id
        self._check_open(rid)
        self._refuse_unknown_adapter(request)
        # As lm-eval, vllm and openai do: "is " + "Paris" is scored as "is" + " Paris".
        context, _ = split_trailing_space(request.context, request.continuation)
        text = request.context + request.continuation
        info = await self.info(rid)
        self._check_length(info, text, 1, rid, prompt_min=2)
        parameters = {"do_sample": False, "max_new_tokens": 1, "details": True, "decoder_input_details": True}
        parameters.update(adapter_fields(request))  # the adapter's prefill logprobs, not the base's
        # One token generated: the answer comes at once, so the idle limit bounds the whole wait.
        scored = self._post(
            "/generate", {"inputs": text, "parameters": parameters}, request, idle=idle_timeout()
        )
        if self._encode is not None:
            k = len(self._encode(text)) - len(self._encode(context))
            body, _ = await scored
        else:
            count = self._count_continuation(text, len(context), request)
            both: list[Any] = await all_or_nothing([scored, count])
            (body, _), k = both
        parts = continuation_logprobs(body, k, backend=self.name, request_id=rid)
        return LoglikelihoodResult(rid, sum(parts), is_greedy=None, num_tokens=k, token_logprobs=parts)

    async def _count_continuation(self, text: str, boundary: int, request: LoglikelihoodRequest) -> int:
        """Tokens of ``text`` that end past character ``boundary`` (the continuation's), by ``/tokenize``."""
        body, _ = await self._post("/tokenize", {"inputs": text}, request, True, idle_timeout())
        try:
            return sum(1 for t in body if t["stop"] > boundary)
        except (KeyError, TypeError) as exc:
            raise self._malformed(request.request_id, exc) from exc

    def _refuse_unknown_adapter(self, request: Request) -> None:
        # TGI itself answers an unknown adapter_id from the base model (its server's adapter index
        # defaults to 0, the base): only this check keeps a misspelt name from scoring the base.
        if self.adapters is not None:
            refuse_unknown_adapter(request, self.adapters, backend=self.name, how="adapters")

    # -- wire ----------------------------------------------------------------------------------------

    async def _send(self, path: str, payload: Any, rid: str | None, idle: float | None) -> HTTPResponse:
        too_large = oversized(payload, self.payload_limit)  # images, in a chat or a text's markdown
        if too_large:
            raise RequestRejectedError(too_large, backend=self.name, request_id=rid)
        return await self._http.request("POST", path, json_body=payload, request_id=rid, idle=idle)

    async def _post(
        self, path: str, payload: Any, request: Any, not_found_hint: bool = False, idle: float | None = None
    ) -> tuple[Any, Mapping[str, str]]:
        rid = request.request_id
        resp = await self._send(path, payload, rid, idle)
        if resp.status == 404 and not_found_hint:
            raise RequestRejectedError(
                "this server cannot tokenize (no fast tokenizer): pass tokenizer= to the tgi backend",
                backend=self.name,
                request_id=rid,
            )
        return self._json(resp, rid), resp.headers

    def _json(self, resp: HTTPResponse, rid: str | None) -> Any:
        return json_body(resp, wire="TGI", backend=self.name, request_id=rid)

    def _malformed(self, rid: str | None, exc: BaseException) -> BackendError:
        return malformed_response("TGI", exc, backend=self.name, request_id=rid)
