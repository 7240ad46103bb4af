"""`TGIBackend` (name ``tgi``): Hugging Face text-generation-inference over its native HTTP API.

One request per call, like every adapter. Text prompts go to ``POST /generate``, chat prompts to
``POST /v1/chat/completions``; loglikelihoods read the prefill logprobs of ``/generate`` with
``decoder_input_details``. `SamplingParams` are mapped the way TGI's router accepts them:

- greedy is ``do_sample: false`` with no temperature, top_k or top_p at all: TGI rejects temperature <= 0,
  and its server turns sampling on whenever a warper (top_k, top_p < 1, temperature != 1) is present;
- sampling is ``do_sample: true`` plus the temperature, ``top_k`` when set and ``top_p`` when below 1
  (TGI requires 0 < top_p < 1);
- ``return_full_text: false`` always (TGI may echo the prompt otherwise) and ``details: true``;
- TGI has no ``n``: n > 1 becomes n concurrent requests with seeds ``seed + i`` inside this one call,
  cancelled together when one fails; TGI's ``best_of`` is not used (it returns one sequence, not n).

``GET /info`` is read once, on first use, so requests TGI would refuse for their length are refused here
before sending. Errors are mapped by `_http.error_for_status`: 422 -> `RequestRejectedError`, 429 ->
`RateLimitedError`, 503 -> `BackendUnavailableError`, 424 and other 5xx -> retryable `BackendError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .._tasks import all_or_nothing
from ..errors import BackendError, InvalidRequestError, RequestRejectedError
from ..protocol import BaseBackend, Secret
from ..types import (
    Capabilities,
    Completion,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
)
from ._http import (
    HTTPResponse,
    HTTPTransport,
    json_body,
    malformed_response,
    poll_until_ok,
    resolve_token,
)
from ._scoring import split_trailing_space

__all__ = ["TGIBackend", "TGIInfo"]

T = TypeVar("T")
_FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}


@dataclass(frozen=True, slots=True)
class TGIInfo:
    """What ``GET /info`` says about the server (fields TGI does not report are ``None``)."""

    model_id: str | None = None
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_stop_sequences: int | None = None
    max_concurrent_requests: int | None = None
    version: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TGIInfo:
        """Parse ``/info``; TGI < 2.0 named ``max_input_tokens`` ``max_input_length``."""

        def num(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(
            model_id=data.get("model_id") if isinstance(data.get("model_id"), str) else None,
            max_input_tokens=num("max_input_tokens") or num("max_input_length"),
            max_total_tokens=num("max_total_tokens"),
            max_stop_sequences=num("max_stop_sequences"),
            max_concurrent_requests=num("max_concurrent_requests"),
            version=data.get("version") if isinstance(data.get("version"), str) else None,
        )


class TGIBackend(BaseBackend):
    """Talks to one text-generation-inference server.

    Args:
        url: The server root, for example ``http://localhost:8080`` (not ``.../v1``).
        token: Bearer token; ``None`` uses the one huggingface_hub finds (``get_token()``), ``False`` none.
        timeout: Seconds one HTTP request may take; ``None`` for no limit (``gather``'s ``timeout`` is
            the per-attempt limit you usually want).
        headers: Extra headers for every request.
        max_connections: Size of the connection pool; keep it at or above the concurrency you run with
            (n > 1 and loglikelihood requests use several connections at once). 0 means unlimited.
        max_concurrency: The concurrency `gather` uses when given none.
        tokenizer: Optional local tokenizer (an object with ``encode(text) -> list[int]``, or a callable) to
            count tokens: loglikelihood continuations without ``POST /tokenize``, and prompt lengths checked
            against ``/info`` before sending.
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
    ) -> None:
        secret = resolve_token(token)
        self.url = url.rstrip("/") if isinstance(url, str) else url
        self._http = HTTPTransport(
            url,
            backend=self.name,
            token=secret,
            headers=headers,
            timeout=timeout,
            max_connections=max_connections,
        )
        self._encode = _encoder(tokenizer)
        self._info: TGIInfo | None = None
        self._info_lock: asyncio.Lock | None = None
        self.capabilities = Capabilities(
            loglikelihood=True,
            is_greedy=False,
            n_samples=True,
            seed=True,
            chat=True,
            logprobs=True,
            stop=True,
            max_concurrency=max_concurrency,
        )

    def __repr__(self) -> str:
        return f"TGIBackend(url={self.url!r})"

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What identifies this backend's outputs for the response cache: the server URL (no secret)."""
        return {"name": self.name, "url": self.url}

    async def _aclose(self) -> None:
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
                resp = await self._http.request("GET", "/info", request_id=request_id)
                if resp.status == 404:
                    self._info = TGIInfo()  # a proxy that hides /info: the server's own checks still apply
                else:
                    self._info = TGIInfo.from_json(self._json(resp, request_id))
        return self._info

    async def wait_until_ready(self, timeout: float = 300.0, interval: float = 0.5) -> None:
        """Poll ``GET /health`` until it answers 200.

        Raises:
            BackendTimeoutError: Not ready within ``timeout`` seconds.
            BackendClosedError: The backend was closed.
        """
        self._check_open()
        await poll_until_ok(self._http, "/health", timeout=timeout, interval=interval, what=self.url)

    async def check_ready(self) -> None:
        """One ``GET /health``: returns when the server answers 200 (a pool's readiness probe).

        Raises:
            BackendError: The mapped error of any other answer, or of a failed connection.
        """
        from ._http import error_for_status

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
        kind = request.prompt_kind
        if kind == "tokens":
            raise RequestRejectedError(
                "TGI takes text or chat prompts, not token ids", backend=self.name, request_id=rid
            )
        if params.max_tokens == 0:
            raise InvalidRequestError("TGI rejects max_new_tokens=0: ask for at least one token")
        if params.seed is not None and params.seed < 0:
            raise InvalidRequestError(f"TGI seeds are unsigned 64-bit integers, got {params.seed}")
        info = await self.info(rid)
        if info.max_stop_sequences is not None and len(params.stop) > info.max_stop_sequences:
            raise InvalidRequestError(
                f"this server accepts at most {info.max_stop_sequences} stop sequences, "
                f"got {len(params.stop)}"
            )
        if kind == "chat":
            if params.top_k is not None:
                raise InvalidRequestError("TGI's chat route has no top_k; leave it None for chat prompts")
            one = self._chat_once
        else:
            self._check_length(info, request.prompt, params.max_tokens, rid)  # type: ignore[arg-type]
            one = self._generate_once
        seeds = [None if params.seed is None else params.seed + i for i in range(params.n)]
        if params.n == 1:
            outs = [await one(request, seeds[0])]
        else:
            outs = await all_or_nothing([one(request, s) for s in seeds])
        return GenerationResult(rid, tuple(c for c, _ in outs), prompt_tokens=outs[0][1], model=info.model_id)

    def _check_length(
        self, info: TGIInfo, text: str, max_new: int, rid: str | None, prompt_min: int = 1
    ) -> None:
        """Refuse what TGI's router would refuse for length; the prompt is counted only with a tokenizer."""
        if info.max_total_tokens is None:
            return
        n_prompt = len(self._encode(text)) if self._encode is not None else prompt_min
        problem = None
        if info.max_input_tokens is not None and n_prompt > info.max_input_tokens:
            problem = f"the prompt has {n_prompt} tokens; this server accepts at most {info.max_input_tokens}"
        elif n_prompt + max_new > info.max_total_tokens:
            problem = (
                f"prompt tokens ({n_prompt}{'' if self._encode else ' at least'}) + max_tokens ({max_new}) "
                f"exceed this server's max_total_tokens ({info.max_total_tokens})"
            )
        if problem:
            raise RequestRejectedError(problem, backend=self.name, request_id=rid)

    @staticmethod
    def _sampling(params: Any) -> dict[str, Any]:
        if params.greedy:
            return {"do_sample": False}
        out: dict[str, Any] = {"do_sample": True, "temperature": params.temperature}
        if params.top_k is not None:
            out["top_k"] = params.top_k
        if params.top_p < 1.0:
            out["top_p"] = params.top_p
        return out

    async def _generate_once(
        self, request: GenerationRequest, seed: int | None
    ) -> tuple[Completion, int | None]:
        params = request.params
        parameters = self._sampling(params)
        parameters.update(max_new_tokens=params.max_tokens, return_full_text=False, details=True)
        if params.stop:
            parameters["stop"] = list(params.stop)
        if seed is not None:
            parameters["seed"] = seed
        data = await self._post("/generate", {"inputs": request.prompt, "parameters": parameters}, request)
        body, headers = data
        try:
            text: str = body["generated_text"]
            details = body.get("details") or {}
            tokens = details.get("tokens") or []
            reason = str(details.get("finish_reason"))
            if reason == "stop_sequence":
                text = _strip_stop(text, params.stop)
            logprobs = tuple(t["logprob"] for t in tokens) if params.logprobs else None
            if logprobs is not None and any(lp is None for lp in logprobs):
                logprobs = None
            completion = Completion(
                text, tuple(t["id"] for t in tokens), logprobs, _FINISH.get(reason, reason)
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise self._malformed(request.request_id, exc) from exc
        return completion, _int_header(headers, "x-prompt-tokens")

    async def _chat_once(self, request: GenerationRequest, seed: int | None) -> tuple[Completion, int | None]:
        params = request.params
        payload: dict[str, Any] = {
            "messages": [dict(m) for m in request.prompt if isinstance(m, Mapping)],
            "max_tokens": params.max_tokens,
            # TGI's chat route reads temperature 0 as greedy (do_sample false), unlike /generate.
            "temperature": params.temperature,
        }
        if params.top_p < 1.0 and not params.greedy:
            payload["top_p"] = params.top_p
        if params.stop:
            payload["stop"] = list(params.stop)
        if seed is not None:
            payload["seed"] = seed
        if params.logprobs:
            payload["logprobs"] = True
        body, _ = await self._post("/v1/chat/completions", payload, request)
        try:
            choice = body["choices"][0]
            text = choice["message"].get("content") or ""
            logprobs = None
            if params.logprobs and choice.get("logprobs"):
                logprobs = tuple(float(t["logprob"]) for t in choice["logprobs"]["content"])
            usage = body.get("usage") or {}
            completion = Completion(text, (), logprobs, choice.get("finish_reason"))
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
            raise self._malformed(request.request_id, exc) from exc
        return completion, usage.get("prompt_tokens")

    # -- loglikelihood -------------------------------------------------------------------------------

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Sum of the continuation's prefill logprobs; ``is_greedy`` is ``None`` (TGI cannot tell)."""
        rid = request.request_id
        self._check_open(rid)
        # As lm-eval, vllm and openai do: "is " + "Paris" is scored as "is" + " Paris".
        context, _ = split_trailing_space(request.context, request.continuation)
        text = request.context + request.continuation
        info = await self.info(rid)
        self._check_length(info, text, 1, rid, prompt_min=2)
        parameters = {"do_sample": False, "max_new_tokens": 1, "details": True, "decoder_input_details": True}
        scored = self._post("/generate", {"inputs": text, "parameters": parameters}, request)
        if self._encode is not None:
            k = len(self._encode(text)) - len(self._encode(context))
            body, _ = await scored
        else:
            count = self._count_continuation(text, len(context), request)
            both: list[Any] = await all_or_nothing([scored, count])
            (body, _), k = both
        try:
            prefill = body["details"]["prefill"]
            logprobs = [t["logprob"] for t in prefill[len(prefill) - k :]] if k > 0 else []
        except (KeyError, TypeError) as exc:
            raise self._malformed(rid, exc) from exc
        if k <= 0 or len(prefill) < k or any(lp is None for lp in logprobs):
            raise RequestRejectedError(
                f"cannot score this continuation: {k} continuation token(s), {len(prefill)} prefill token(s) "
                "(the first input token has no logprob: give a context, or a model that adds BOS)",
                backend=self.name,
                request_id=rid,
            )
        parts = tuple(float(lp) for lp in logprobs)
        return LoglikelihoodResult(rid, sum(parts), is_greedy=None, num_tokens=k, token_logprobs=parts)

    async def _count_continuation(self, text: str, boundary: int, request: LoglikelihoodRequest) -> int:
        """Tokens of ``text`` that end past character ``boundary`` (the continuation's), by ``/tokenize``."""
        body, _ = await self._post("/tokenize", {"inputs": text}, request, not_found_hint=True)
        try:
            return sum(1 for t in body if t["stop"] > boundary)
        except (KeyError, TypeError) as exc:
            raise self._malformed(request.request_id, exc) from exc

    # -- wire ----------------------------------------------------------------------------------------

    async def _post(
        self, path: str, payload: Any, request: Any, not_found_hint: bool = False
    ) -> tuple[Any, Mapping[str, str]]:
        rid = request.request_id
        resp = await self._http.request("POST", path, json_body=payload, request_id=rid)
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


def _strip_stop(text: str, stops: Sequence[str]) -> str:
    # TGI's text ends with the stop sequence that ended it; ours never includes it.
    for stop in sorted(stops, key=len, reverse=True):
        if text.endswith(stop):
            return text[: -len(stop)]
    return text


def _int_header(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _encoder(tokenizer: Any) -> Callable[[str], Sequence[int]] | None:
    if tokenizer is None:
        return None
    encode = getattr(tokenizer, "encode", None)
    if callable(encode):
        return encode  # type: ignore[no-any-return]
    if callable(tokenizer):
        return tokenizer  # type: ignore[no-any-return]
    raise InvalidRequestError("tokenizer must have an encode(text) method or be a callable text -> token ids")
