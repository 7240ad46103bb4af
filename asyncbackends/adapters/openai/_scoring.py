"""Loglikelihoods on a vLLM server for the ``openai`` adapter: its ``POST /tokenize`` and echoed logprobs.

Context and continuation are tokenized by the server's ``/tokenize`` (at the server root, beside ``/v1``)
and split on token ids exactly as the in-process ``vllm`` adapter splits them (`_scoring`, the request's
`Split`); the token-id prompt is then sent to ``/completions`` with ``echo: true``, so each prompt token comes
back with its logprob and the top-1 alternative (which says whether it is greedy).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar

from ..._tasks import all_or_nothing
from ..._text import split_of
from ..._timeouts import idle_timeout
from ..._types import LoglikelihoodRequest, LoglikelihoodResult, Request, RollingLoglikelihoodRequest
from ...errors import BackendError, ContextLengthError, RequestRejectedError
from .._http.transport import HTTPResponse, HTTPTransport
from .._scoring import ScoringPlan, aplan_loglikelihood, plan_rolling, scored_result
from ._lora import ServerAdapters, adapter_rejection, model_for
from ._wire import echo_payload, parse_echo

__all__ = ["VLLMServerScoring"]


class VLLMServerScoring:
    """``loglikelihood`` and ``loglikelihood_rolling`` through a vLLM server, mixed into `OpenAIBackend`.

    The backend provides the attributes and exchanges declared here; a server not recognised as vLLM
    (``server != "vllm"``) refuses every scoring request.
    """

    # Provided by OpenAIBackend (and BaseBackend under it).
    name: ClassVar[str]
    model: str
    server: str
    base_url: str
    max_model_len: int | None
    _http: HTTPTransport
    _special: tuple[tuple[int, ...], int | None] | None  # (BOS prefix, empty-context token), once probed
    _special_lock: asyncio.Lock | None
    adapters: ServerAdapters

    if TYPE_CHECKING:

        def _check_open(self, request_id: str | None = None) -> None: ...

        async def _post(self, path: str, payload: Any, rid: str | None, idle: float | None = None) -> Any: ...

        def _json(self, resp: HTTPResponse, rid: str | None) -> Any: ...

        def _malformed(self, rid: str | None, exc: BaseException) -> BackendError: ...

        async def _listed(self) -> set[str]: ...

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Score the continuation's tokens given the context's, exactly as the in-process ``vllm`` adapter."""
        rid = request.request_id
        self._check_open(rid)
        self._require_vllm(rid)
        model = await self._adapter_model(request)
        prefix, stand_in = await self._special_tokens(rid)
        if not request.context.rstrip() and stand_in is None:
            raise self._no_stand_in(rid)

        async def encode(texts: list[str]) -> list[list[int]]:
            return await all_or_nothing([self._tokenize(text, rid) for text in texts])

        scoring = await aplan_loglikelihood(
            request.context,
            request.continuation,
            encode=encode,
            prefix=prefix,
            empty_context_token=stand_in if stand_in is not None else -1,
            max_prompt_tokens=self._max_prompt_tokens,
            split=split_of(request),
        )
        if scoring is None:
            raise ContextLengthError(
                f"continuation does not fit in max_model_len={self.max_model_len}",
                backend=self.name,
                request_id=rid,
            )
        return scored_result(rid, await self._score(scoring, rid, model, request))

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Score a whole text in windows of the model's length, every token once (perplexity tasks)."""
        rid = request.request_id
        self._check_open(rid)
        self._require_vllm(rid)
        model = await self._adapter_model(request)
        _, stand_in = await self._special_tokens(rid)
        if stand_in is None:
            raise self._no_stand_in(rid)
        ids = await self._tokenize(request.text, rid)
        plans = plan_rolling(ids, prefix_token=stand_in, max_prompt_tokens=self._max_prompt_tokens)
        windows = await all_or_nothing([self._score(p, rid, model, request) for p in plans])
        return scored_result(rid, [item for window in windows for item in window])

    async def _adapter_model(self, request: LoglikelihoodRequest | RollingLoglikelihoodRequest) -> str:
        """The ``model`` the echo is asked of: the request's adapter (loaded first, where to be), or the base.

        The text is tokenized by the base model's name all the same: an adapter shares its base's tokenizer
        (the in-process ``vllm`` adapter splits with the base's too), so one probe of special tokens serves.
        """
        self.adapters.refuse_unknown(request)
        await self.adapters.ensure_loaded(request.adapter, request.request_id, self._listed)
        return model_for(self.model, request)

    @property
    def _max_prompt_tokens(self) -> int:
        # vLLM runs an echo-only request as one generated token: the prompt must leave room for it.
        return (self.max_model_len - 1) if self.max_model_len else 2**31

    def _require_vllm(self, rid: str | None) -> None:
        if self.server != "vllm":
            raise RequestRejectedError(
                "loglikelihood needs a vLLM server (its /tokenize route and echoed prompt logprobs); "
                f"{self.base_url} was not recognised as one (pass server='vllm' if it is)",
                backend=self.name,
                request_id=rid,
            )

    def _no_stand_in(self, rid: str | None) -> RequestRejectedError:
        return RequestRejectedError(
            "this model's tokenizer adds no BOS token, so an empty context (or a rolling window's start) has "
            "no token to condition on: give a non-empty context",
            backend=self.name,
            request_id=rid,
        )

    async def _special_tokens(self, rid: str | None) -> tuple[tuple[int, ...], int | None]:
        """The tokens the tokenizer puts in front of every text (Llama's BOS), found once by probing."""
        if self._special is not None:
            return self._special
        if self._special_lock is None:
            self._special_lock = asyncio.Lock()
        async with self._special_lock:
            if self._special is None:
                with_special, plain = await all_or_nothing(
                    [self._tokenize("a", rid, special=True), self._tokenize("a", rid)]
                )
                n = len(with_special) - len(plain)
                prefix = tuple(with_special[:n]) if n > 0 and with_special[n:] == plain else ()
                self._special = (prefix, prefix[0] if prefix else None)
        return self._special

    async def _tokenize(self, text: str, rid: str | None, special: bool = False) -> list[int]:
        payload = {"model": self.model, "prompt": text, "add_special_tokens": special}
        resp = await self._http.request(
            "POST", "/tokenize", json_body=payload, request_id=rid, idle=idle_timeout()
        )
        if resp.status == 404:
            raise RequestRejectedError(
                f"{self._http.base_url}/tokenize does not exist: loglikelihood needs vLLM's server",
                backend=self.name,
                request_id=rid,
            )
        body = self._json(resp, rid)
        try:
            return [int(t) for t in body["tokens"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise self._malformed(rid, exc) from exc

    async def _score(
        self, plan: ScoringPlan, rid: str | None, model: str, request: Request
    ) -> list[tuple[float, bool]]:
        """Each scored token's (logprob, is it the top-1 token) from the echoed prompt logprobs."""
        if plan.scored == 0:  # a continuation that merged into the context (lm-eval's split): an empty sum
            return []
        try:
            body = await self._post("/completions", echo_payload(model, plan), rid, idle_timeout())
        except BackendError as exc:
            raise adapter_rejection(exc, request, self.base_url) from exc
        try:
            return parse_echo(body, plan)
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
            raise self._malformed(rid, exc) from exc
