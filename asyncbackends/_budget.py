"""A run's spending limit: `Budget`, and `BudgetGuard`, which checks it before each attempt is sent.

Before an attempt goes out, the guard reserves its worst case: its prompt's size plus ``max_tokens * n``,
and at the backend's `Pricing` the dearest those tokens can cost. It is sent only if what was spent, plus
every reservation in flight, plus its own, stays within the budget. When it would fit on what was spent
alone, it waits for the attempts in flight to settle (each settles at what its result used, usually far less
than its worst case); when it cannot fit even then, it ends with `BudgetExceededError` and is never sent, and
so does every request after it (the budget is spent: a run stops at one point, not here and there).

A prompt's size is not known before the backend tokenizes it: it is estimated as `RateLimit` charges it
(token ids counted, text at four characters a token), then scaled by the largest ratio of counted to
estimated prompt tokens the run's results have shown. Until a first result has shown that ratio, one attempt
is in flight at a time, so a run whose prompts are alike never passes its budget; prompts much longer in
tokens than any before them can pass it by their own underestimate.

A failed attempt settles at nothing: the providers this library speaks to do not bill refused or failed
requests. A result read from the cache spends nothing either; its usage still counts in `RunMetrics`.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from ._field_checks import is_int
from ._limits import estimated_tokens
from ._results import GenerationResult
from ._types import GenerationRequest, Request, Result
from ._usage import Pricing
from .errors import BudgetExceededError, InvalidRequestError

__all__ = ["Budget", "BudgetGuard", "Reservation", "check_budget"]


@dataclass(frozen=True, slots=True)
class Budget:
    """The most one run may spend; a request that would pass it is not sent.

    Args:
        tokens: The most tokens (prompt plus completion, over every attempt sent); ``None``: no limit.
        cost: The most money, at the backend's `Pricing` (a run with a cost budget through a backend with no
            pricing is refused before it starts); ``None``: no limit.

    Raises:
        InvalidRequestError: A limit is negative or not a number.
    """

    tokens: int | None = None
    cost: float | None = None

    def __post_init__(self) -> None:
        if self.tokens is not None and (not is_int(self.tokens) or self.tokens < 0):
            raise InvalidRequestError(f"Budget.tokens must be an int >= 0 or None, got {self.tokens!r}")
        cost = self.cost
        if cost is not None and (
            not isinstance(cost, (int, float)) or isinstance(cost, bool) or not 0 <= cost < math.inf
        ):
            raise InvalidRequestError(f"Budget.cost must be a finite number >= 0 or None, got {cost!r}")


def check_budget(budget: object, pricing: Pricing | None) -> None:
    """Refuse a ``budget`` that is not a `Budget`, or one with a cost limit for a backend with no prices.

    Raises:
        InvalidRequestError: Either.
    """
    if not isinstance(budget, Budget):
        raise InvalidRequestError(f"budget must be a Budget or None, got {type(budget).__name__}")
    if budget.cost is not None and pricing is None:
        raise InvalidRequestError(
            "a cost budget needs the backend's prices: create it with pricing=ab.Pricing(...)"
        )


@dataclass(slots=True)
class Reservation:
    """One attempt's worst case, held against the budget until it settles.

    Args:
        tokens: Prompt and completion tokens at most (the prompt's estimated).
        cost: What they can cost at most.
        estimated_prompt: The prompt's estimate before scaling (to learn the scale from its result).
    """

    tokens: float
    cost: float
    estimated_prompt: float = 0.0


class BudgetGuard:
    """One run's spending against its `Budget`; made on the loop the run uses.

    Args:
        budget: The run's limits.
        pricing: The backend's prices (required when the budget has a cost limit).
        batch: The run goes through a provider batch (costs at ``pricing.batch``).

    Raises:
        InvalidRequestError: A cost limit without a pricing.
    """

    def __init__(self, budget: Budget, pricing: Pricing | None, *, batch: bool = False) -> None:
        check_budget(budget, pricing)
        self.budget, self.pricing, self.batch = budget, pricing, batch
        self.spent_tokens = 0
        self.spent_cost = 0.0
        self._reserved = Reservation(0.0, 0.0)
        self._in_flight = 0
        self._settled = asyncio.Event()
        self._prompt_scale = 1.0  # the most counted prompt tokens per estimated one, seen so far
        self._calibrated = False
        self._spent_out = False  # a request was refused: every later one is refused too

    def worst_case(self, request: Request) -> Reservation:
        """What ``request`` can spend at most (its prompt size estimated and scaled)."""
        out = request.params.max_tokens * request.params.n if isinstance(request, GenerationRequest) else 0
        estimated_prompt = estimated_tokens(request) - out
        prompt = estimated_prompt * self._prompt_scale
        if self.pricing is None:
            return Reservation(prompt + out, 0.0, estimated_prompt)
        cost = self.pricing.worst_cost(prompt, out)
        if self.batch and self.pricing.batch is not None:
            cost *= self.pricing.batch
        return Reservation(prompt + out, cost, estimated_prompt)

    def _fits(self, worst: Reservation, *, with_reserved: bool) -> bool:
        held = self._reserved if with_reserved else Reservation(0.0, 0.0)
        tokens, cost = self.budget.tokens, self.budget.cost
        return (tokens is None or self.spent_tokens + held.tokens + worst.tokens <= tokens) and (
            cost is None or self.spent_cost + held.cost + worst.cost <= cost
        )

    async def reserve(self, request: Request) -> Reservation | BudgetExceededError:
        """Hold ``request``'s worst case, waiting for attempts in flight to settle where that may help.

        Returns:
            The reservation to `settle`, or the error the request ends with: it cannot fit even once every
            attempt in flight has settled.
        """
        worst = self.worst_case(request)
        if self._spent_out:
            return BudgetExceededError(self._refusal(worst), request_id=request.request_id)
        while not self._fits(worst, with_reserved=True) or (self._in_flight and not self._calibrated):
            if self._spent_out or self._in_flight == 0 or not self._fits(worst, with_reserved=False):
                self._spent_out = True
                return BudgetExceededError(self._refusal(worst), request_id=request.request_id)
            self._settled.clear()
            await self._settled.wait()
            worst = self.worst_case(request)  # the scale may have grown
        self._reserved.tokens += worst.tokens
        self._reserved.cost += worst.cost
        self._in_flight += 1
        return worst

    def settle(self, reservation: Reservation, result: Result | None) -> None:
        """Release ``reservation`` and spend what ``result`` used (``None``: the attempt failed)."""
        self._reserved.tokens -= reservation.tokens
        self._reserved.cost -= reservation.cost
        self._in_flight -= 1
        if result is not None:
            if isinstance(result, GenerationResult):
                usage = result.usage
                if result.prompt_tokens is not None and reservation.estimated_prompt > 0:
                    ratio = result.prompt_tokens / reservation.estimated_prompt
                    self._prompt_scale = max(self._prompt_scale, ratio)
                self._calibrated = True
                self.spent_tokens += usage.total_tokens
                if self.pricing is not None:
                    self.spent_cost += self.pricing.cost(usage, batch=self.batch)
            else:  # a score reports no prompt count: charged at its estimate, as reserved
                self.spent_tokens += math.ceil(reservation.tokens)
                self.spent_cost += reservation.cost
                self._calibrated = True
        self._settled.set()

    def _refusal(self, worst: Reservation) -> str:
        parts = []
        if self.budget.tokens is not None:
            parts.append(f"{self.spent_tokens} of {self.budget.tokens} tokens spent")
        if self.budget.cost is not None:
            parts.append(f"{self.spent_cost:.6g} of {self.budget.cost:.6g} spent")
        return (
            f"not sent: the run's budget cannot cover this request's worst case ({worst.tokens:.0f} tokens"
            + (f", {worst.cost:.6g}" if self.budget.cost is not None else "")
            + f"); {'; '.join(parts)}. Resume from the cache with a larger budget to send it"
        )
