"""`SamplingParams`: how to sample a generation, validated at construction.

Its optional parameters (`OPTIONAL_SAMPLING_PARAMS`) are ``None`` unless set; a backend that cannot honour
one that is set says so in its `Capabilities` and refuses the request before sending anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from ._field_checks import is_int, is_number, set_field
from ._sampling_table import OPTIONAL_SPECS
from .errors import InvalidRequestError

__all__ = ["OPTIONAL_SAMPLING_PARAMS", "REASONING_EFFORTS", "ReasoningEffort", "SamplingParams"]

ReasoningEffort: TypeAlias = Literal["none", "minimal", "low", "medium", "high"]
"""How hard a reasoning model thinks, on OpenAI's scale."""

REASONING_EFFORTS: tuple[ReasoningEffort, ...] = ("none", "minimal", "low", "medium", "high")
"""The values `SamplingParams.reasoning_effort` takes, least effort first."""


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
        reasoning_effort: How hard a reasoning model thinks, on OpenAI's scale: ``"none"``, ``"minimal"``,
            ``"low"``, ``"medium"`` or ``"high"`` (sent where the server takes it).
        thinking_budget: The most tokens a reasoning model may spend thinking (>= 0; vLLM's
            ``thinking_token_budget``).

    The last nine are ``None`` by default, meaning the engine's default; a backend that cannot honour one
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
    reasoning_effort: ReasoningEffort | None = None
    thinking_budget: int | None = None

    def __post_init__(self) -> None:
        if not is_int(self.max_tokens) or self.max_tokens < 0:
            raise InvalidRequestError(f"max_tokens must be an int >= 0, got {self.max_tokens!r}")
        if not is_number(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            raise InvalidRequestError(f"top_k must be an int >= 1 or None, got {self.top_k!r}")
        if not is_int(self.n) or self.n < 1:
            raise InvalidRequestError(f"n must be an int >= 1, got {self.n!r}")
        if self.n > 1 and self.temperature == 0:
            raise InvalidRequestError(
                f"n={self.n} with temperature=0: greedy samples would all be equal; set temperature > 0"
            )
        if self.seed is not None and not is_int(self.seed):
            raise InvalidRequestError(f"seed must be an int or None, got {self.seed!r}")
        if not isinstance(self.logprobs, bool):
            raise InvalidRequestError(f"logprobs must be a bool, got {self.logprobs!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop):
            raise InvalidRequestError(f"stop must be a sequence of non-empty strings, got {self.stop!r}")
        set_field(self, "stop", tuple(stop))
        # 0 and 0.0 must be one request (cache keys, equality), whichever way it was written.
        set_field(self, "temperature", float(self.temperature))
        set_field(self, "top_p", float(self.top_p))
        self._check_optional()

    def _check_optional(self) -> None:
        # Ranges (the table's) are vLLM's (sampling_params.py), the widest any backend accepts; each adapter
        # refuses what its own engine cannot take.
        for name, (low, high, closed) in _RANGES.items():
            value = getattr(self, name)
            if value is None:
                continue
            above = is_number(value) and (value >= low if closed else value > low)
            if not above or value > high:
                where = f"in [{low:g}, {high:g}]" if closed else f"> {low:g} and finite"
                raise InvalidRequestError(f"{name} must be a number {where}, or None; got {value!r}")
            set_field(self, name, float(value))
        if self.min_tokens is not None and (
            not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens
        ):
            raise InvalidRequestError(
                f"min_tokens must be an int in [0, max_tokens={self.max_tokens}], or None; "
                f"got {self.min_tokens!r}"
            )
        if self.json_schema is not None and self.regex is not None:
            raise InvalidRequestError("json_schema and regex are mutually exclusive: give one constraint")
        if self.json_schema is not None:
            set_field(self, "json_schema", _copy_schema(self.json_schema))
        if self.regex is not None:
            if not isinstance(self.regex, str) or not self.regex:
                raise InvalidRequestError(f"regex must be a non-empty str or None, got {self.regex!r}")
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise InvalidRequestError(f"regex does not compile: {exc}") from exc
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            raise InvalidRequestError(
                f"reasoning_effort must be one of {', '.join(map(repr, REASONING_EFFORTS))} or None; "
                f"got {self.reasoning_effort!r}"
            )
        budget = self.thinking_budget
        if budget is not None and (not is_int(budget) or budget < 0):
            raise InvalidRequestError(f"thinking_budget must be an int >= 0 or None, got {budget!r}")

    @property
    def greedy(self) -> bool:
        """Whether this asks for greedy decoding (temperature 0)."""
        return self.temperature == 0

    def optional_params(self) -> dict[str, Any]:
        """The optional parameters that are set (not ``None``), by name, in their declaration order."""
        return {n: getattr(self, n) for n in OPTIONAL_SAMPLING_PARAMS if getattr(self, n) is not None}


OPTIONAL_SAMPLING_PARAMS: tuple[str, ...] = tuple(spec.name for spec in OPTIONAL_SPECS)
"""The `SamplingParams` fields a backend may not honour; `Capabilities` has a flag of each name."""

# (low, high, low included) of each optional float parameter, from the table.
_RANGES: dict[str, tuple[float, float, bool]] = {s.name: s.bounds for s in OPTIONAL_SPECS if s.bounds}


def _copy_schema(schema: object) -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        raise InvalidRequestError(f"json_schema must be a mapping (a JSON Schema) or None, got {schema!r}")
    try:
        # A JSON round trip: a deep copy the caller cannot mutate afterwards, and proof it can be sent.
        copied: dict[str, Any] = json.loads(json.dumps(schema, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"json_schema must be JSON-serialisable: {exc}") from exc
    return copied
