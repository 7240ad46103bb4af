"""Adaptive concurrency: a server's capacity found as the run goes, not guessed by the user.

`AdaptiveConcurrency` holds the settings (``concurrency="adaptive"`` means its defaults); `AdaptiveLimiter`
is the limit itself, shared by one run's workers (`asyncbackends._run`) or by every run through
``ab.limited(backend, concurrency="adaptive")``. Each attempt holds one of its slots while it is sent.

The limit moves once per round (as many answered attempts as the limit, all started under it):

- a rate-limit or overload answer (`RateLimitedError`: 429, TGI's "overloaded"; `BackendUnavailableError`:
  503, refused connections) cuts it at once to ``backoff`` times itself, and a ``Retry-After`` pauses every
  new attempt for that long. Only attempts started since the last cut can cut it again, so one burst of
  refusals counts once;
- a clean round raises it: doubled until the first cut or hold (slow start), then by a tenth (at least one);
- queueing delay holds or lowers it: the gradient is the round's median latency over the lowest latency
  seen (the 10th percentile of the quietest round). Past half-way to ``latency_tolerance`` the limit holds;
  past the tolerance it falls to ``limit * tolerance / gradient``, so a server that queues instead of
  refusing is not flooded either.

docs/reliability.md says what was compared to choose this (measured by
benchmarks/core/adaptive_concurrency.py).
Nothing here is bound to a loop until the first `AdaptiveLimiter.acquire`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .errors import (
    BackendTimeoutError,
    BackendUnavailableError,
    InvalidRequestError,
    RateLimitedError,
)

__all__ = ["AdaptiveConcurrency", "AdaptiveLimiter", "ChangeReason", "Ticket", "adaptive_limiter"]

ChangeReason = Literal["rate_limited", "overloaded", "clean_round", "queueing"]
"""Why the limit moved: a 429 / overloaded answer, a 503 or refused connection, a round without either, or
queueing delay (latency grown past the tolerance)."""

MIN_ROUND = 8
"""Fewest answers a round is judged on: a median of two or three latencies is mostly noise."""

NOISE_S = 0.002
"""Latency rises smaller than this are the client's own scheduling noise, never counted as queueing."""

MAX_PAUSE_S = 60.0
"""Longest pause a ``Retry-After`` imposes on new attempts (a mistaken header must not stall a run)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class AdaptiveConcurrency:
    """Settings of an adaptive concurrency limit (``concurrency="adaptive"`` is ``AdaptiveConcurrency()``).

    Args:
        initial: The limit the run starts with.
        min: The limit never falls below this.
        max: The limit never rises above this (and a run never starts more workers).
        backoff: Factor the limit is multiplied by on a rate-limit or overload answer (0 < backoff < 1).
        latency_tolerance: How far a round's median latency may rise above the lowest seen before the limit
            is lowered (``1.5``: half as long again); from half-way there the limit holds. ``None`` ignores
            latency, for servers whose latency grows with load by design (an in-process engine batching more).

    Raises:
        InvalidRequestError: A value of the wrong type or out of range.
    """

    initial: int = 16
    min: int = 1
    max: int = 512
    backoff: float = 0.9
    latency_tolerance: float | None = 1.5

    def __post_init__(self) -> None:
        for name in ("initial", "min", "max"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise InvalidRequestError(f"AdaptiveConcurrency.{name} must be an int >= 1, got {value!r}")
        if not self.min <= self.initial <= self.max:
            raise InvalidRequestError(
                f"AdaptiveConcurrency needs min <= initial <= max, got min={self.min}, "
                f"initial={self.initial}, max={self.max}"
            )
        backoff = self.backoff
        if not isinstance(backoff, (int, float)) or isinstance(backoff, bool) or not 0 < backoff < 1:
            raise InvalidRequestError(
                f"AdaptiveConcurrency.backoff must be a number in (0, 1), got {backoff!r}"
            )
        tolerance = self.latency_tolerance
        if tolerance is not None and (
            not isinstance(tolerance, (int, float))
            or isinstance(tolerance, bool)
            or not 1 < tolerance < float("inf")
        ):
            raise InvalidRequestError(
                "AdaptiveConcurrency.latency_tolerance must be a finite number > 1 or None, "
                f"got {tolerance!r}"
            )


@dataclass(slots=True)
class Ticket:
    """One held slot: when it was granted and under which cut of the limit."""

    started: float
    generation: int


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


class AdaptiveLimiter:
    """A concurrency limit that follows the server's answers; waiters are served in order.

    Args:
        settings: The limits and factors.
        on_change: Called with ``(new_limit, reason)`` each time the limit moves.

    Attributes:
        limit: Attempts allowed in flight now.
        in_flight: Attempts holding a slot now.
        changes: How many times the limit moved, by `ChangeReason`.
        holds: Rounds whose latency held the limit where it was.
        lowest: The lowest limit reached; ``highest`` the highest.
    """

    def __init__(
        self, settings: AdaptiveConcurrency, on_change: Callable[[int, ChangeReason], None] | None = None
    ) -> None:
        self.settings = settings
        self.on_change = on_change
        self.limit = self.lowest = self.highest = settings.initial
        self.in_flight = 0
        self.changes: Counter[str] = Counter()
        self.holds = 0
        self.paused_until = 0.0
        self._generation = 0
        self._slow_start = True
        self._round: list[float] = []  # latencies of this round's answered attempts
        self._round_answers = 0
        self._baseline = math.inf  # lowest latency seen: the 10th percentile of the quietest round
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        return f"AdaptiveLimiter(limit={self.limit}, in_flight={self.in_flight}, {self.settings!r})"

    def has_room(self) -> bool:
        """Whether a slot is free now: below the limit, not paused, nobody waiting ahead."""
        return self.in_flight < self.limit and not self._waiters and time.monotonic() >= self.paused_until

    def try_acquire(self) -> Ticket | None:
        """Take a slot if one is free now (see `has_room`), else ``None``; never waits."""
        if not self.has_room():
            return None
        self.in_flight += 1
        return Ticket(time.monotonic(), self._generation)

    async def acquire(self) -> Ticket:
        """Wait for a slot (and for any ``Retry-After`` pause to end) and take it."""
        while True:
            pause = self.paused_until - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
                continue
            ticket = self.try_acquire()
            if ticket is not None:
                return ticket
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if not waiter.cancelled() and waiter.done():
                    self._wake()  # woken then cancelled: hand the wake-up on
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if self.in_flight < self.limit and time.monotonic() >= self.paused_until:
                self.in_flight += 1
                self._wake()
                return Ticket(time.monotonic(), self._generation)

    def release(self, ticket: Ticket, error: BaseException | None) -> None:
        """Give the slot back and learn from the attempt: ``error`` as it raised, ``None`` if it answered.

        A cancelled attempt (`asyncio.CancelledError`) only gives the slot back.
        """
        self.in_flight -= 1
        now = time.monotonic()
        try:
            if isinstance(error, asyncio.CancelledError):
                return
            if isinstance(error, (RateLimitedError, BackendUnavailableError)):
                self._overloaded(ticket, error, now)
                return
            if ticket.generation != self._generation:
                return  # started under an older limit: says nothing about this one
            self._round_answers += 1
            if error is None or isinstance(error, BackendTimeoutError):
                self._round.append(now - ticket.started)
            if self._round_answers >= max(self.limit, MIN_ROUND):
                self._end_round()
        finally:
            self._wake()

    def _overloaded(self, ticket: Ticket, error: BaseException, now: float) -> None:
        retry_after = getattr(error, "retry_after", None)
        if isinstance(retry_after, (int, float)) and retry_after > 0:
            self.paused_until = max(self.paused_until, now + min(float(retry_after), MAX_PAUSE_S))
        if ticket.generation != self._generation:
            return  # this burst of refusals already cut the limit
        reason: ChangeReason = "rate_limited" if isinstance(error, RateLimitedError) else "overloaded"
        self._slow_start = False
        self._set(math.floor(self.limit * self.settings.backoff), reason)

    def _end_round(self) -> None:
        latencies, self._round, self._round_answers = self._round, [], 0
        tolerance = self.settings.latency_tolerance
        if tolerance is not None and latencies:
            self._baseline = min(self._baseline, _quantile(latencies, 0.1))
            median = _quantile(latencies, 0.5)
            quiet = median - self._baseline < NOISE_S or self._baseline <= 0
            ratio = 1.0 if quiet else median / self._baseline
            if ratio > tolerance:
                # Gradient: a queue grows latency in proportion to the excess requests, so the limit
                # that brings the median back within tolerance is about limit * tolerance / ratio.
                self._slow_start = False
                self._set(math.floor(self.limit * max(0.5, tolerance / ratio)), "queueing")
                return
            if ratio > (1 + tolerance) / 2:
                self._slow_start = False
                self.holds += 1
                self._generation += 1  # judge the next round on attempts started from now
                return
        grown = self.limit * 2 if self._slow_start else self.limit + max(1, self.limit // 10)
        self._set(grown, "clean_round")

    def _set(self, limit: int, reason: ChangeReason) -> None:
        limit = max(self.settings.min, min(self.settings.max, limit))
        self._generation += 1
        self._round, self._round_answers = [], 0
        if limit == self.limit:
            return
        self.limit = limit
        self.lowest, self.highest = min(self.lowest, limit), max(self.highest, limit)
        self.changes[reason] += 1
        if self.on_change is not None:
            self.on_change(limit, reason)

    def _wake(self) -> None:
        free = self.limit - self.in_flight
        for waiter in self._waiters:
            if free <= 0:
                break
            if not waiter.done():
                waiter.set_result(None)
                free -= 1


def adaptive_limiter(
    backend: object,
    settings: AdaptiveConcurrency,
    on_change: Callable[[int, ChangeReason], None] | None = None,
) -> AdaptiveLimiter:
    """The adaptive limit a run (or ``ab.limited``) holds its attempts to on ``backend``.

    A backend that limits its own parts adaptively (a pool: one limit a replica) says which through an
    ``_adaptive_limit(settings, on_change)`` method, so the two limits never fight; any other backend gets a
    fresh `AdaptiveLimiter`.
    """
    own = getattr(backend, "_adaptive_limit", None)
    if callable(own):
        limiter: AdaptiveLimiter = own(settings, on_change)
        return limiter
    return AdaptiveLimiter(settings, on_change)
