"""Requests, results and capabilities: frozen, slotted dataclasses validated at construction.

Validation happens when a request is built, so nothing invalid ever reaches a backend; each failure raises
`InvalidRequestError` naming the field.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from .errors import InvalidRequestError

__all__ = [
    "CHAT_ROLES",
    "OPTIONAL_SAMPLING_PARAMS",
    "Capabilities",
    "ChatMessage",
    "Completion",
    "GenerationRequest",
    "GenerationResult",
    "LoglikelihoodRequest",
    "LoglikelihoodResult",
    "Prompt",
    "Request",
    "Result",
    "RollingLoglikelihoodRequest",
    "SamplingParams",
]

ChatMessage: TypeAlias = Mapping[str, str]
"""One chat message: ``{"role": "user", "content": "..."}``."""

Prompt: TypeAlias = str | tuple[ChatMessage, ...] | tuple[int, ...]
"""A prompt after normalisation: text, chat messages, or token ids."""

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
"""The chat roles a `GenerationRequest` accepts."""

FinishReason: TypeAlias = Literal["stop", "length", "abort", "error"] | str


def _is_int(value: object) -> bool:
    # bool is an int subclass; True as a token id or max_tokens is always a mistake.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _set(obj: object, name: str, value: object) -> None:
    # Normalising fields of a frozen dataclass in __post_init__ needs the object.__setattr__ escape hatch.
    object.__setattr__(obj, name, value)


def _ints(name: str, values: object) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidRequestError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    try:
        # operator.index takes numpy and other integer types, refuses floats and bools are ints anyway.
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise InvalidRequestError(f"{name} must hold only ints") from None


def _floats(name: str, values: object) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidRequestError(
            f"{name} must be a sequence of numbers or None, got {type(values).__name__}"
        )
    try:
        return tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"{name} must hold only numbers") from None


def _check_request_id(request_id: object) -> None:
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequestError(f"request_id must be a str or None, got {type(request_id).__name__}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample a generation.

    Args:
        max_tokens: Most tokens to generate per completion (>= 0).
        temperature: 0 means greedy; must be >= 0.
        top_p: Nucleus mass in (0, 1]; 1 disables it.
        top_k: Keep the k most likely tokens; ``None`` disables it.
        stop: Strings that end a completion (not included in its text).
        n: Completions per request; n > 1 needs temperature > 0.
        seed: Seed for reproducible sampling, when the backend supports it.
        logprobs: Return each generated token's logprob.
        repetition_penalty: Divide the logits of tokens already in the prompt or output (> 0; 1 disables
            it), as in CTRL and vLLM.
        presence_penalty: Subtract this from the logits of tokens already generated, in [-2, 2].
        frequency_penalty: Subtract this times each token's count so far from its logit, in [-2, 2].
        min_p: Drop tokens less likely than ``min_p`` times the most likely one, in [0, 1].
        min_tokens: Generate at least this many tokens before EOS or a stop string may end a completion
            (0 <= min_tokens <= max_tokens).
        json_schema: Constrain the output to JSON valid against this JSON Schema (a mapping, kept as a
            deep copy).
        regex: Constrain the output to match this regular expression (it must compile with `re`).

    The last seven are ``None`` by default, meaning the engine's default; a backend that cannot honour one
    that is set refuses the request with `RequestRejectedError` before sending anything (see
    `Capabilities`). ``json_schema`` and ``regex`` are mutually exclusive.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None
    logprobs: bool = False
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    # A dict is unhashable: the schema takes part in equality (and the cache key), not in hash().
    json_schema: Mapping[str, Any] | None = field(default=None, hash=False)
    regex: str | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 0:
            raise InvalidRequestError(f"max_tokens must be an int >= 0, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise InvalidRequestError(f"top_k must be an int >= 1 or None, got {self.top_k!r}")
        if not _is_int(self.n) or self.n < 1:
            raise InvalidRequestError(f"n must be an int >= 1, got {self.n!r}")
        if self.n > 1 and self.temperature == 0:
            raise InvalidRequestError(
                f"n={self.n} with temperature=0: greedy samples would all be equal; set temperature > 0"
            )
        if self.seed is not None and not _is_int(self.seed):
            raise InvalidRequestError(f"seed must be an int or None, got {self.seed!r}")
        if not isinstance(self.logprobs, bool):
            raise InvalidRequestError(f"logprobs must be a bool, got {self.logprobs!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop):
            raise InvalidRequestError(f"stop must be a sequence of non-empty strings, got {self.stop!r}")
        _set(self, "stop", tuple(stop))
        # 0 and 0.0 must be one request (cache keys, equality), whichever way it was written.
        _set(self, "temperature", float(self.temperature))
        _set(self, "top_p", float(self.top_p))
        self._check_optional()

    def _check_optional(self) -> None:
        # Ranges are vLLM's (sampling_params.py), the widest any backend accepts; each adapter refuses what
        # its own engine cannot take.
        for name, (low, high, closed) in _RANGES.items():
            value = getattr(self, name)
            if value is None:
                continue
            above = _is_number(value) and (value >= low if closed else value > low)
            if not above or value > high:
                where = f"in [{low:g}, {high:g}]" if closed else f"> {low:g} and finite"
                raise InvalidRequestError(f"{name} must be a number {where}, or None; got {value!r}")
            _set(self, name, float(value))
        if self.min_tokens is not None and (
            not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens
        ):
            raise InvalidRequestError(
                f"min_tokens must be an int in [0, max_tokens={self.max_tokens}], or None; "
                f"got {self.min_tokens!r}"
            )
        if self.json_schema is not None and self.regex is not None:
            raise InvalidRequestError("json_schema and regex are mutually exclusive: give one constraint")
        if self.json_schema is not None:
            _set(self, "json_schema", _copy_schema(self.json_schema))
        if self.regex is not None:
            if not isinstance(self.regex, str) or not self.regex:
                raise InvalidRequestError(f"regex must be a non-empty str or None, got {self.regex!r}")
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise InvalidRequestError(f"regex does not compile: {exc}") from exc

    @property
    def greedy(self) -> bool:
        """Whether this asks for greedy decoding (temperature 0)."""
        return self.temperature == 0

    def optional_params(self) -> dict[str, Any]:
        """The optional parameters that are set (not ``None``), by name, in their declaration order."""
        return {n: getattr(self, n) for n in OPTIONAL_SAMPLING_PARAMS if getattr(self, n) is not None}


OPTIONAL_SAMPLING_PARAMS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_p",
    "min_tokens",
    "json_schema",
    "regex",
)
"""The `SamplingParams` fields a backend may not honour; `Capabilities` has a flag of each name."""

# (low, high, low included) of each optional float parameter.
_RANGES: dict[str, tuple[float, float, bool]] = {
    "repetition_penalty": (0.0, math.inf, False),
    "presence_penalty": (-2.0, 2.0, True),
    "frequency_penalty": (-2.0, 2.0, True),
    "min_p": (0.0, 1.0, True),
}


def _copy_schema(schema: object) -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        raise InvalidRequestError(f"json_schema must be a mapping (a JSON Schema) or None, got {schema!r}")
    try:
        # A JSON round trip: a deep copy the caller cannot mutate afterwards, and proof it can be sent.
        copied: dict[str, Any] = json.loads(json.dumps(schema, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"json_schema must be JSON-serialisable: {exc}") from exc
    return copied


def _normalise_prompt(prompt: object) -> Prompt:
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt must not be empty")
        return prompt
    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
        raise InvalidRequestError(
            "prompt must be a str, a list of chat messages or a list of token ids, "
            f"got {type(prompt).__name__}"
        )
    if len(prompt) == 0:
        raise InvalidRequestError("prompt must not be empty")
    if all(_is_int(t) for t in prompt):
        if any(t < 0 for t in prompt):
            raise InvalidRequestError("prompt token ids must be >= 0")
        return tuple(prompt)
    if all(isinstance(m, Mapping) for m in prompt):
        return tuple(_normalise_message(i, m) for i, m in enumerate(prompt))
    raise InvalidRequestError("prompt list must hold only token ids (int) or only chat messages (dict)")


def _normalise_message(index: int, message: Mapping[str, Any]) -> ChatMessage:
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise InvalidRequestError(f"prompt[{index}].role must be one of {sorted(CHAT_ROLES)}, got {role!r}")
    content = message.get("content")
    if not isinstance(content, str):
        raise InvalidRequestError(f"prompt[{index}].content must be a str, got {type(content).__name__}")
    extra = set(message) - {"role", "content", "name"}
    if extra:
        raise InvalidRequestError(f"prompt[{index}] has unknown keys {sorted(extra)}")
    return dict(message)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """Generate text for one prompt.

    Args:
        prompt: Text, a list of chat messages (``{"role", "content"}``), or a list of token ids.
        params: How to sample.
        request_id: Your id for this request; echoed in its result and errors.
    """

    prompt: Prompt
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str | None = None

    def __post_init__(self) -> None:
        _set(self, "prompt", _normalise_prompt(self.prompt))
        if not isinstance(self.params, SamplingParams):
            raise InvalidRequestError(f"params must be SamplingParams, got {type(self.params).__name__}")
        _check_request_id(self.request_id)

    @property
    def prompt_kind(self) -> Literal["text", "chat", "tokens"]:
        """Which of the three prompt forms this request holds."""
        if isinstance(self.prompt, str):
            return "text"
        return "tokens" if _is_int(self.prompt[0]) else "chat"


@dataclass(frozen=True, slots=True)
class Completion:
    """One generated completion.

    Args:
        text: The generated text (the prompt not included; stop strings not included).
        token_ids: The generated token ids, where the backend reports them.
        logprobs: Each generated token's logprob, when asked for and available.
        finish_reason: Why generation stopped: ``"stop"``, ``"length"``, or the backend's word.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] | None = None
    finish_reason: FinishReason | None = None

    def __post_init__(self) -> None:
        # Checked cheaply (results are built once per request on the hot path) but enough that every
        # completion the constructor accepts survives the response cache's round trip unchanged.
        if not isinstance(self.text, str):
            raise InvalidRequestError(f"text must be a str, got {type(self.text).__name__}")
        if type(self.token_ids) is not tuple:
            # None is "not reported", like (): one value for it, so a cached copy compares equal.
            _set(self, "token_ids", _ints("token_ids", () if self.token_ids is None else self.token_ids))
        if self.logprobs is not None and type(self.logprobs) is not tuple:
            _set(self, "logprobs", _floats("logprobs", self.logprobs))
        if self.finish_reason is not None and not isinstance(self.finish_reason, str):
            raise InvalidRequestError(f"finish_reason must be a str or None, got {self.finish_reason!r}")


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """The result of one `GenerationRequest`.

    Args:
        request_id: The request's id.
        completions: Exactly ``params.n`` completions, in index order.
        prompt_tokens: Tokens in the prompt, where known.
        model: The model that answered, where known.
    """

    request_id: str | None
    completions: tuple[Completion, ...]
    prompt_tokens: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        _check_request_id(self.request_id)
        if type(self.completions) is not tuple:
            if isinstance(self.completions, (str, bytes)) or not isinstance(self.completions, Sequence):
                raise InvalidRequestError("completions must be a sequence of Completion")
            _set(self, "completions", tuple(self.completions))
        if not all(type(c) is Completion for c in self.completions):
            raise InvalidRequestError("completions must be a sequence of Completion")
        if self.prompt_tokens is not None and not _is_int(self.prompt_tokens):
            raise InvalidRequestError(f"prompt_tokens must be an int or None, got {self.prompt_tokens!r}")
        if self.model is not None and not isinstance(self.model, str):
            raise InvalidRequestError(f"model must be a str or None, got {type(self.model).__name__}")

    @property
    def text(self) -> str:
        """The first completion's text."""
        return self.completions[0].text

    @property
    def completion_tokens(self) -> int:
        """Generated tokens over all completions (0 where the backend gave no token ids)."""
        return sum(len(c.token_ids) for c in self.completions)


@dataclass(frozen=True, slots=True)
class LoglikelihoodRequest:
    """Score ``continuation`` given ``context``: log P(continuation | context).

    Args:
        context: The conditioning text (may be empty: the model's BOS/EOS token then stands in).
        continuation: The text to score; must not be empty.
        request_id: Your id for this request.
    """

    context: str
    continuation: str
    request_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.context, str):
            raise InvalidRequestError(f"context must be a str, got {type(self.context).__name__}")
        if not isinstance(self.continuation, str) or not self.continuation:
            raise InvalidRequestError("continuation must be a non-empty str")
        _check_request_id(self.request_id)


@dataclass(frozen=True, slots=True)
class RollingLoglikelihoodRequest:
    """Score a whole text (perplexity tasks): the sum over windows of the model's length.

    Args:
        text: The text to score; must not be empty.
        request_id: Your id for this request.
    """

    text: str
    request_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text:
            raise InvalidRequestError("text must be a non-empty str")
        _check_request_id(self.request_id)


@dataclass(frozen=True, slots=True)
class LoglikelihoodResult:
    """The result of a loglikelihood request.

    Args:
        request_id: The request's id.
        logprob: The summed log probability (never positive).
        is_greedy: Whether greedy decoding would produce the continuation; ``None`` where unknowable.
        num_tokens: Tokens scored.
        token_logprobs: Each scored token's logprob, where the backend reports them.
    """

    request_id: str | None
    logprob: float
    is_greedy: bool | None = None
    num_tokens: int = 0
    token_logprobs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _check_request_id(self.request_id)
        if (
            not isinstance(self.logprob, (int, float))
            or isinstance(self.logprob, bool)
            or self.logprob != self.logprob
        ):
            raise InvalidRequestError(f"logprob must be a number (not NaN), got {self.logprob!r}")
        if type(self.logprob) is not float:
            _set(self, "logprob", float(self.logprob))
        if self.is_greedy is not None and not isinstance(self.is_greedy, bool):
            raise InvalidRequestError(f"is_greedy must be a bool or None, got {self.is_greedy!r}")
        if not _is_int(self.num_tokens):
            raise InvalidRequestError(f"num_tokens must be an int, got {self.num_tokens!r}")
        if self.token_logprobs is not None and type(self.token_logprobs) is not tuple:
            _set(self, "token_logprobs", _floats("token_logprobs", self.token_logprobs))


Request: TypeAlias = GenerationRequest | LoglikelihoodRequest | RollingLoglikelihoodRequest
Result: TypeAlias = GenerationResult | LoglikelihoodResult


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do. Every field defaults to "cannot" so ``Capabilities()`` is valid.

    Args:
        loglikelihood: Implements `loglikelihood`.
        rolling_loglikelihood: Implements ``loglikelihood_rolling`` (perplexity tasks).
        is_greedy: Loglikelihood results say whether the continuation is greedy.
        n_samples: Returns ``n`` completions for one request (natively or by fanning out).
        seed: Honours ``SamplingParams.seed`` reproducibly.
        chat: Accepts chat-message prompts.
        token_ids: Accepts token-id prompts and reports generated token ids.
        logprobs: Can return per-token logprobs of generated tokens.
        stop: Honours stop strings.
        max_concurrency: The concurrency `gather` uses when the caller gives none; ``None`` for the default.
        repetition_penalty: Honours ``SamplingParams.repetition_penalty``.
        presence_penalty: Honours ``SamplingParams.presence_penalty``.
        frequency_penalty: Honours ``SamplingParams.frequency_penalty``.
        min_p: Honours ``SamplingParams.min_p``.
        min_tokens: Honours ``SamplingParams.min_tokens``.
        json_schema: Constrains outputs to ``SamplingParams.json_schema``.
        regex: Constrains outputs to ``SamplingParams.regex``.

    A backend refuses a request that sets an optional sampling parameter whose flag is false with
    `RequestRejectedError` naming it, before sending anything (`unsupported` lists them).
    """

    loglikelihood: bool = False
    rolling_loglikelihood: bool = False
    is_greedy: bool = False
    n_samples: bool = False
    seed: bool = False
    chat: bool = False
    token_ids: bool = False
    logprobs: bool = False
    stop: bool = False
    max_concurrency: int | None = None
    repetition_penalty: bool = False
    presence_penalty: bool = False
    frequency_penalty: bool = False
    min_p: bool = False
    min_tokens: bool = False
    json_schema: bool = False
    regex: bool = False

    def unsupported(self, params: SamplingParams) -> tuple[str, ...]:
        """The optional parameters ``params`` sets that this backend does not honour (empty if none)."""
        return tuple(name for name in params.optional_params() if not getattr(self, name))
