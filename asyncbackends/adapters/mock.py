"""`MockBackend` (name ``mock``): a deterministic, engine-free reference adapter.

Its "model" reads one character as one token (token id = code point) and greedily echoes the prompt back,
so tests can predict every output. Sampling (temperature > 0) shuffles the prompt's characters with a
generator seeded from ``seed`` and the completion's index: the same seed gives the same samples.
``min_tokens`` repeats the prompt until the completion is that long (stop strings apply from there on);
``regex`` and ``json_schema`` make every completion the shortest text that satisfies the constraint
(`_minimal_match`); the parameters that act on logits (the penalties..., `SamplingParamSpec.needs_logits`)
need logits the mock does not have, so they are refused with `RequestRejectedError`, like any parameter a
backend cannot honour.

Chat: each message reads ``role: content``; a text part reads as its text and an image part as
``[image <sha256 of its bytes, 16 hex>]`` (of the URL for an http(s) image, which the mock never fetches),
so the echo names every image it saw. Tools: with ``tool_choice`` a tool's name, or ``"required"`` (the first
tool), every completion is one call to that tool whose arguments are the smallest JSON satisfying its
parameters schema (required properties only, as ``json_schema`` above). With ``"auto"`` the mock calls the
first tool whose name appears in the last message's text, else it echoes; ``"none"`` always echoes. Latency,
jitter and failures can be injected, and counters record what the backend saw (attempts, peak in-flight
requests, cancellations), which makes it the backend of choice for tests, docs and dry runs.

Reasoning (option ``thinking``): before its answer the mock thinks its prompt backwards, as long as the
prompt at the default effort (`_mock_thinking`); ``max_tokens`` counts the thought, and one cut off while
thinking has no answer (``reasoning_truncated``, text ``""``, finish ``"length"``).

LoRA adapters (option ``adapters``, the names it serves): a request naming one reads the adapter's name
first, so its echo starts with ``[name] ``, and its scores shift by a salt taken from the name (every token's
logprob differs from the base model's); an unknown name is refused naming the known ones.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from .._field_checks import is_int, is_number
from .._protocol import BaseBackend
from .._refusals import refuse_unclaimed_chat, refuse_unknown_adapter, refuse_unsupported
from .._sampling_table import OPTIONAL_SPECS
from .._types import (
    Capabilities,
    Completion,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
    SamplingParams,
)
from ..errors import (
    BackendBrokenError,
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ContextLengthError,
    InvalidRequestError,
    RateLimitedError,
    RequestRejectedError,
)
from ._mock_model import (
    answer_within,
    constrained_text,
    content_text,
    cut_at_stop,
    echo_logprobs,
    score,
    tool_call,
)
from ._mock_thinking import THINK_END, ThinkingMode, thought_of

__all__ = ["MockBackend"]

FailureKind = Literal[
    "rate_limited", "unavailable", "timeout", "rejected", "context_length", "broken", "server"
]
_FAILURES: dict[str, type[BackendError]] = {
    "rate_limited": RateLimitedError,
    "unavailable": BackendUnavailableError,
    "timeout": BackendTimeoutError,
    "rejected": RequestRejectedError,
    "context_length": ContextLengthError,
    "broken": BackendBrokenError,
    "server": BackendError,
}


_NO_LOGITS = dict.fromkeys(
    (spec.name for spec in OPTIONAL_SPECS if spec.needs_logits),
    "the mock's echo model has no logits to apply it to",
)


class MockBackend(BaseBackend):
    """The deterministic reference adapter.

    Args:
        latency: Seconds each attempt takes.
        jitter: Extra seconds drawn uniformly from [0, jitter] per attempt.
        failure_rate: Probability that an attempt fails with ``failure``.
        fail_attempts: Every request's first ``fail_attempts`` attempts fail with ``failure``.
        failure: Which error injected failures raise.
        retry_after: ``retry_after`` of injected `RateLimitedError`.
        seed: Seed of the failure and jitter generator.
        max_concurrency: The concurrency hint reported in `capabilities`.
        model: The model name reported in results and the fingerprint.
        images: Claim `Capabilities.images` (accept image parts); false to test refusals.
        tools: Claim `Capabilities.tools` (accept tools and return tool calls); false to test refusals.
        max_model_len: The context length in the mock's tokens (characters): a prompt plus ``max_tokens``
            (a context plus continuation) over it is a `ContextLengthError`; ``None``: no limit.
        adapters: The LoRA adapter names it serves (a sequence, or one comma-separated str from the command
            line); with any, `Capabilities.adapters` is claimed.
        thinking: Make the mock a reasoning model (`_mock_thinking`: it thinks its prompt backwards before it
            answers, ``reasoning_effort`` and ``thinking_budget`` honoured). ``"split"``: the thought in
            `Completion.reasoning` (a backend with a reasoning parser; stop strings end the answer only);
            ``"inline"``: the thought in the text, closed by ``</think>`` (a server without one); ``"off"``.
    """

    name = "mock"

    def __init__(
        self,
        *,
        latency: float = 0.0,
        jitter: float = 0.0,
        failure_rate: float = 0.0,
        fail_attempts: int = 0,
        failure: FailureKind = "unavailable",
        retry_after: float | None = None,
        seed: int = 0,
        max_concurrency: int | None = None,
        model: str = "mock-echo",
        images: bool = True,
        tools: bool = True,
        max_model_len: int | None = None,
        thinking: ThinkingMode = "off",
        adapters: Sequence[str] | str = (),
    ) -> None:
        # Options may come from the command line as text: a wrong type is a clear error, not a TypeError.
        numbers: dict[str, float | None] = {
            "latency": latency,
            "jitter": jitter,
            "failure_rate": failure_rate,
            "retry_after": retry_after,
        }
        integers: dict[str, int | None] = {
            "fail_attempts": fail_attempts,
            "seed": seed,
            "max_concurrency": max_concurrency,
            "max_model_len": max_model_len,
        }
        for kind, check, values in (("a number", is_number, numbers), ("an integer", is_int, integers)):
            for option, value in values.items():
                if not check(value) and not (
                    value is None and option in ("retry_after", "max_concurrency", "max_model_len")
                ):
                    raise InvalidRequestError(f"mock option {option} must be {kind}, got {value!r}")
        if latency < 0 or jitter < 0:
            raise InvalidRequestError("latency and jitter must be >= 0")
        if not 0 <= failure_rate <= 1:
            raise InvalidRequestError(f"failure_rate must be in [0, 1], got {failure_rate!r}")
        if failure not in _FAILURES:
            raise InvalidRequestError(f"failure must be one of {sorted(_FAILURES)}, got {failure!r}")
        self.latency, self.jitter = float(latency), float(jitter)
        self.failure_rate, self.fail_attempts = failure_rate, fail_attempts
        if thinking not in ("off", "split", "inline"):
            raise InvalidRequestError(f"mock option thinking must be off, split or inline, got {thinking!r}")
        self.thinking: ThinkingMode = thinking
        self.failure, self.retry_after = failure, retry_after
        self.model = model
        self.max_model_len = max_model_len
        self._rng = random.Random(seed)
        self.adapters: tuple[str, ...] = tuple(
            a.strip() for a in (adapters.split(",") if isinstance(adapters, str) else adapters) if a.strip()
        )
        self.capabilities = Capabilities(
            loglikelihood=True,
            rolling_loglikelihood=True,
            is_greedy=True,
            n_samples=True,
            seed=True,
            chat=True,
            token_ids=True,
            logprobs=True,
            stop=True,
            max_concurrency=max_concurrency,
            min_tokens=True,
            json_schema=True,
            regex=True,
            images=bool(images),
            tools=bool(tools),
            reasoning=thinking == "split",
            reasoning_effort=thinking != "off",
            thinking_budget=thinking != "off",
            adapters=bool(self.adapters),
        )
        self.attempts: Counter[str | None] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.cancelled = 0
        self.completed = 0

    def _check_length(self, tokens: int, request_id: str | None) -> None:
        if self.max_model_len is not None and tokens > self.max_model_len:
            raise ContextLengthError(
                f"mock: {tokens} tokens (prompt plus max_tokens) exceed max_model_len={self.max_model_len}",
                backend=self.name,
                request_id=request_id,
            )

    @property
    def fingerprint(self) -> dict[str, str]:
        """What identifies this backend's outputs, for the response cache."""
        identity = {"name": self.name, "model": self.model}
        # A thinking mock answers differently; a plain one keeps the key that caches filled before had.
        if self.thinking != "off":
            identity["thinking"] = self.thinking
        return identity

    async def check_ready(self) -> None:
        """A pool's readiness probe: ready while open and not failing every attempt (``failure_rate=1``).

        Raises:
            BackendClosedError: After `aclose`.
            BackendUnavailableError: ``failure_rate`` is 1.
        """
        self._check_open()
        if self.failure_rate >= 1:
            raise BackendUnavailableError("mock: failing every attempt", backend=self.name)

    async def _attempt(self, key: str | None, request_id: str | None) -> None:
        """Count the attempt, sleep the injected latency, then maybe fail."""
        self._check_open(request_id)
        self.attempts[key] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            delay = self.latency + (self._rng.uniform(0, self.jitter) if self.jitter else 0.0)
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        # Closed while this request was in flight: it ends as closed, not as a result (closed is closed).
        self._check_open(request_id)
        failing = self.attempts[key] <= self.fail_attempts or (
            self.failure_rate and self._rng.random() < self.failure_rate
        )
        if failing:
            cls = _FAILURES[self.failure]
            message = f"injected {self.failure} failure"
            if cls is RateLimitedError:
                raise RateLimitedError(
                    message, retry_after=self.retry_after, backend=self.name, request_id=request_id
                )
            raise cls(message, backend=self.name, request_id=request_id)
        self.completed += 1

    @staticmethod
    def prompt_text(request: GenerationRequest) -> str:
        """The text the mock echoes for a prompt: chat turns joined, token ids mapped to printable ASCII."""
        prompt = request.prompt
        # An adapter's model reads its name first (the module's docstring).
        head = "" if request.adapter is None else f"[{request.adapter}] "
        if isinstance(prompt, str):
            return head + prompt
        if request.prompt_kind == "tokens":
            return head + "".join(chr(0x20 + t % 95) for t in prompt)  # type: ignore[operator]
        return head + "\n".join(f"{m['role']}: {content_text(m['content'])}" for m in prompt)  # type: ignore[index]

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Echo the prompt (greedy) or a seeded shuffle of it (sampling), ``n`` times."""
        text = self.prompt_text(request)
        params = request.params
        refuse_unsupported(
            params, self.capabilities, backend=self.name, request_id=request.request_id, reasons=_NO_LOGITS
        )
        refuse_unclaimed_chat(request, self.capabilities, backend=self.name)
        refuse_unknown_adapter(request, self.adapters, backend=self.name, how="adapters option")
        self._check_length(len(text) + params.max_tokens, request.request_id)
        constrained = constrained_text(request, self.name)
        call = tool_call(request, text, self.name)
        await self._attempt(request.request_id or text, request.request_id)
        if call is not None:
            return GenerationResult(
                request.request_id,
                tuple(Completion("", tool_calls=(call,)) for _ in range(params.n)),
                prompt_tokens=len(text),
                model=self.model,
            )
        thought = thought_of(text, params) if self.thinking != "off" else None
        completions = []
        for index in range(params.n):
            chars = list(text)
            if constrained is not None:
                chars = list(constrained)
            elif not params.greedy:
                seed = params.seed if params.seed is not None else random.getrandbits(64)
                random.Random(f"{seed}:{index}").shuffle(chars)
            completions.append(self._completion(text, chars, thought, params))
        return GenerationResult(
            request.request_id, tuple(completions), prompt_tokens=len(text), model=self.model
        )

    def _completion(
        self, prompt: str, chars: list[str], thought: str | None, params: SamplingParams
    ) -> Completion:
        """One completion: the thought (if the mock thinks), then the answer ``chars``, within max_tokens."""
        before = "" if thought is None else thought + (THINK_END if self.thinking == "inline" else "")
        if len(before) > params.max_tokens:
            return self._cut_while_thinking(prompt, before[: params.max_tokens], params)
        out, finish = answer_within(chars, params.max_tokens - len(before), params.min_tokens or 0)
        if self.thinking == "split" and thought is not None:
            # The stop strings end the answer only: a "\n" inside the thought does not cut it.
            out, finish = cut_at_stop(out, finish, params)
            return Completion(
                out,
                tuple(map(ord, thought + out)),
                echo_logprobs(prompt, thought + out, params),
                finish,
                reasoning=thought,
                reasoning_tokens=len(thought),
            )
        # Without a reasoning parser (off, inline) the text is all that was generated: stops apply to it all.
        out, finish = cut_at_stop(before + out, finish, params)
        return Completion(out, tuple(map(ord, out)), echo_logprobs(prompt, out, params), finish)

    def _cut_while_thinking(self, prompt: str, generated: str, params: SamplingParams) -> Completion:
        """max_tokens ran out before the thought ended: no answer (split), or the open thought (inline)."""
        if self.thinking == "inline":
            text, finish = cut_at_stop(generated, "length", params)
            return Completion(text, tuple(map(ord, text)), echo_logprobs(prompt, text, params), finish)
        return Completion(
            "",
            tuple(map(ord, generated)),
            echo_logprobs(prompt, generated, params),
            "length",
            reasoning=generated,
            reasoning_tokens=len(generated),
            reasoning_truncated=True,
        )

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Score with the mock's fixed distribution; greedy means the continuation echoes the context."""
        refuse_unknown_adapter(request, self.adapters, backend=self.name, how="adapters option")
        self._check_length(len(request.context) + len(request.continuation), request.request_id)
        await self._attempt(request.request_id or request.context + request.continuation, request.request_id)
        parts = score(request.context, request.continuation, request.adapter)
        return LoglikelihoodResult(
            request.request_id,
            sum(parts),
            is_greedy=request.context.startswith(request.continuation),
            num_tokens=len(parts),
            token_logprobs=parts,
        )

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Score the whole text, each character given the ones before it."""
        refuse_unknown_adapter(request, self.adapters, backend=self.name, how="adapters option")
        await self._attempt(request.request_id or request.text, request.request_id)
        parts = score("", request.text, request.adapter)
        return LoglikelihoodResult(request.request_id, sum(parts), None, len(parts), parts)
