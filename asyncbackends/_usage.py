"""What a result used and what it cost: `Usage`, and `Pricing` as the user states it for a backend.

No price list is shipped or fetched: prices change, and the user knows what they pay. A backend's prices are
given once (``create_backend(..., pricing=ab.Pricing(...))``) and read by every run through it
(`pricing_of`), wrappers included.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._field_checks import is_int
from .errors import InvalidRequestError

__all__ = ["Pricing", "Usage", "as_pricing", "attach_pricing", "pricing_of"]


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one result used, as the backend counted them.

    Args:
        prompt_tokens: Prompt tokens, cached ones included (0 where the backend gave no count).
        cached_prompt_tokens: Of those, the tokens read from a prefix or provider prompt cache.
        completion_tokens: Generated tokens over all completions, thinking included.
        reasoning_tokens: Of those, the tokens spent thinking.
    """

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "reasoning_tokens"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise InvalidRequestError(f"{name} must be an int >= 0, got {value!r}")

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


def _price(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
        raise InvalidRequestError(f"Pricing.{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Pricing:
    """A backend's prices, in the user's currency, per ``per`` tokens.

    Args:
        input: Price of uncached prompt tokens.
        output: Price of generated tokens.
        cached_input: Price of prompt tokens read from the provider's cache; ``None``: the input price.
        reasoning: Price of thinking tokens; ``None``: the output price (as OpenAI bills them).
        batch: Multiplier for results answered through a provider batch (``0.5`` for OpenAI's Batch API);
            ``None``: batches cost as much as direct requests.
        per: How many tokens the prices are for (1,000,000 as providers list them).

    Raises:
        InvalidRequestError: A price is negative or not a number, or ``per`` is not a positive int.
    """

    input: float
    output: float
    cached_input: float | None = None
    reasoning: float | None = None
    batch: float | None = None
    per: int = 1_000_000

    def __post_init__(self) -> None:
        _price("input", self.input, optional=False)
        _price("output", self.output, optional=False)
        _price("cached_input", self.cached_input, optional=True)
        _price("reasoning", self.reasoning, optional=True)
        _price("batch", self.batch, optional=True)
        if not is_int(self.per) or self.per < 1:
            raise InvalidRequestError(f"Pricing.per must be an int >= 1, got {self.per!r}")

    def cost(self, usage: Usage, *, batch: bool = False) -> float:
        """What ``usage`` costs at these prices (at the batch multiplier when ``batch``)."""
        cached = min(usage.cached_prompt_tokens, usage.prompt_tokens)
        reasoning = min(usage.reasoning_tokens, usage.completion_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        reasoning_price = self.output if self.reasoning is None else self.reasoning
        total = (
            (usage.prompt_tokens - cached) * self.input
            + cached * cached_price
            + (usage.completion_tokens - reasoning) * self.output
            + reasoning * reasoning_price
        ) / self.per
        return total * self.batch if batch and self.batch is not None else total

    def worst_cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        """The most ``prompt_tokens`` in and ``completion_tokens`` out can cost (no cache, dearest output)."""
        reasoning = self.output if self.reasoning is None else self.reasoning
        return (prompt_tokens * self.input + completion_tokens * max(self.output, reasoning)) / self.per


def as_pricing(value: object, *, where: str = "pricing") -> Pricing:
    """``value`` as a `Pricing`: one already, or a mapping of its fields (a model-args string, the CLI).

    Raises:
        InvalidRequestError: Neither, a field unknown or missing, or a price out of range.
    """
    if isinstance(value, Pricing):
        return value
    if not isinstance(value, Mapping):
        raise InvalidRequestError(f"{where} must be an ab.Pricing or a mapping of its fields, got {value!r}")
    fields = {f.name for f in dataclasses.fields(Pricing)}
    unknown = sorted(set(value) - fields)
    if unknown:
        raise InvalidRequestError(
            f"{where}: unknown field {unknown[0]!r}; known: {', '.join(sorted(fields))}"
        )
    missing = [name for name in ("input", "output") if name not in value]
    if missing:
        raise InvalidRequestError(
            f"{where}: {' and '.join(missing)} must be given (prices per {1_000_000:,} tokens)"
        )
    return Pricing(**value)


def pricing_of(backend: Any) -> Pricing | None:
    """The prices a run through ``backend`` pays: its own, else those of the backend it wraps."""
    seen: set[int] = set()
    while backend is not None and id(backend) not in seen:
        seen.add(id(backend))
        pricing = getattr(backend, "pricing", None)
        if isinstance(pricing, Pricing):
            return pricing
        backend = getattr(backend, "backend", None)  # `limited`, `with_adapter`: the backend they wrap
    return None


def attach_pricing(backend: Any, pricing: Pricing) -> None:
    """Give ``backend`` its prices (the ``pricing=`` option every backend takes through `create_backend`).

    Raises:
        InvalidRequestError: The backend cannot hold one.
    """
    try:
        backend.pricing = pricing
    except AttributeError as exc:
        raise InvalidRequestError(
            f"backend {getattr(backend, 'name', backend)!r} cannot hold a pricing (no settable attribute)"
        ) from exc
