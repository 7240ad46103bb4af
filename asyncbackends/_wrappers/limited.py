"""`ab.limited`: a backend whose concurrency, rate limits and budget hold across every run that uses it.

`gather`'s own ``concurrency`` and ``rate_limit`` belong to one run: two concurrent runs on one server each
get the full amount. Wrapping the backend once, ``shared = ab.limited(backend, concurrency=8)``, and
passing ``shared`` to every run makes the limit the server's: its slots and token buckets are the
wrapper's, so every run (and any direct call) queues on the same ones. Waiting for them is waiting for a
slot, so it never counts toward `gather`'s per-attempt timeout; the attempt's clock runs once a slot is
held. The slots and buckets are created on first use, on the shared loop, and every call waits on them
there, whichever loop it comes from (an ``asyncio.run`` call, a notebook), so a later run still finds them.
A ``budget`` there is one spending limit for every run (an eval framework's several runs per eval): each
call reserves its worst case before it is sent, as a run's own ``budget`` does (`asyncbackends._budget`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from .._adaptive import AdaptiveConcurrency, AdaptiveLimiter, ChangeReason, adaptive_limiter
from .._budget import Budget, BudgetGuard, check_budget
from .._clock import held_slot, waiting_for_slot
from .._limits import RateBuckets
from .._loop import get_loop_manager
from .._options import Concurrency, RateLimit, check_limits, rate_buckets
from .._protocol import AsyncBackend, SupportsFingerprint, SupportsRollingLoglikelihood
from .._timeouts import TimeoutOption, Timeouts, as_timeouts, set_idle_timeout
from .._types import Request
from .._usage import pricing_of
from ..errors import BackendTimeoutError, BudgetExceededError
from .forwarding import ForwardingBackend, ForwardingRolling, Send

__all__ = ["LimitedBackend", "LimitedRollingBackend", "limited"]

R = TypeVar("R")


class LimitedBackend(ForwardingBackend):
    """A backend that sends through ``backend`` within limits shared by every caller.

    Build it with `limited`. Its name, capabilities and fingerprint are the wrapped backend's (so a cache
    filled through one serves the other); `aclose` closes the wrapped backend.

    Attributes:
        backend: The wrapped backend.
        concurrency: Most requests in flight through this wrapper at once (an int, ``"adaptive"`` or an
            `AdaptiveConcurrency`), or ``None``.
        rate_limit: Request and token rates shared by every run, or ``None``.
        timeout: `Timeouts` every call through the wrapper keeps (from when it holds a slot), or ``None``.
        budget: The spending limit every call through the wrapper shares, or ``None``.
    """

    def __init__(
        self,
        backend: AsyncBackend,
        *,
        concurrency: Concurrency = None,
        rate_limit: RateLimit | None = None,
        timeout: TimeoutOption = None,
        budget: Budget | None = None,
    ) -> None:
        self._adaptive = check_limits(concurrency, rate_limit)
        if budget is not None:
            check_budget(budget, pricing_of(backend))
        self.budget = budget
        self._guard: BudgetGuard | None = None
        self.timeout: Timeouts | None = None if timeout is None else as_timeouts(timeout)
        super().__init__(backend)
        self.concurrency = concurrency
        self.rate_limit = rate_limit
        # Loop-bound: made on first use, on the loop that serves the requests.
        self._slots: asyncio.Semaphore | None = None
        self._limiter: AdaptiveLimiter | None = None
        self._rates: RateBuckets | None = None
        self._ready = False

    def __repr__(self) -> str:
        return (
            f"limited({self.backend!r}, concurrency={self.concurrency!r}, rate_limit={self.rate_limit!r}, "
            f"timeout={self.timeout!r})"
        )

    @property
    def fingerprint(self) -> Mapping[str, Any] | None:
        """The wrapped backend's fingerprint: limits do not change outputs."""
        return self.backend.fingerprint if isinstance(self.backend, SupportsFingerprint) else None

    def _make_state(self) -> None:
        if self._adaptive is not None:
            self._limiter = adaptive_limiter(self.backend, self._adaptive)
        elif isinstance(self.concurrency, int):
            self._slots = asyncio.Semaphore(self.concurrency)
        self._rates = rate_buckets(self.rate_limit)
        if self.budget is not None:
            self._guard = BudgetGuard(self.budget, pricing_of(self.backend))
        self._ready = True

    async def _send(self, request: Any, send: Send[R]) -> R:
        # On the shared loop whichever loop calls: the slots and buckets serve every run, so they must not
        # be bound to a loop that ends (an ``asyncio.run`` call) before a later run waits on them.
        return await get_loop_manager().arun(self._limited(request, lambda: send(request)))

    async def _limited(self, request: Request, call: Callable[[], Coroutine[Any, Any, R]]) -> R:
        if not self._ready:
            self._make_state()
        if self._rates is not None:
            # Rate tokens first, while holding nothing: the wait is untimed and blocks no slot.
            async with waiting_for_slot():
                await self._rates.take(request)
        if self.timeout is not None:
            call = self._timed(call, self.timeout, request.request_id)
        if self._guard is not None:
            return await self._within_budget(self._guard, request, call)
        return await self._in_slot(call)

    async def _in_slot(self, call: Callable[[], Coroutine[Any, Any, R]]) -> R:
        if self._limiter is not None:
            return await self._adaptively(self._limiter, call)
        async with held_slot(self._slots):
            return await call()

    async def _within_budget(
        self, guard: BudgetGuard, request: Request, call: Callable[[], Coroutine[Any, Any, R]]
    ) -> R:
        # Waiting for the budget (attempts in flight to settle) is waiting for a slot: never timed.
        async with waiting_for_slot():
            held = await guard.reserve(request)
        if isinstance(held, BudgetExceededError):
            held.backend = self.name
            raise held
        try:
            result = await self._in_slot(call)
        except BaseException:
            guard.settle(held, None)
            raise
        guard.settle(held, result)  # type: ignore[arg-type]  # R is the call's Result
        return result

    def _timed(
        self, call: Callable[[], Coroutine[Any, Any, R]], timeouts: Timeouts, request_id: str | None
    ) -> Callable[[], Coroutine[Any, Any, R]]:
        """``call`` within the wrapper's timeouts, the run's own (tighter ones win) still applying."""

        async def timed() -> R:
            # Set and reset here: on the shared loop this runs in the caller's own task.
            token = set_idle_timeout(timeouts.idle) if timeouts.idle is not None else None
            try:
                if timeouts.total is None:
                    return await call()
                deadline = asyncio.timeout(timeouts.total)
                try:
                    async with deadline:
                        return await call()
                except TimeoutError as exc:
                    if not deadline.expired():
                        # The backend's own timeout (an idle stall, an HTTP 408): its message and
                        # request id are the ones to keep.
                        raise
                    raise BackendTimeoutError(
                        f"took longer than the limited backend's {timeouts.total:g} s",
                        backend=self.name,
                        request_id=request_id,
                    ) from exc
            finally:
                if token is not None:
                    token.var.reset(token)

        return timed

    async def _adaptively(self, limiter: AdaptiveLimiter, call: Callable[[], Coroutine[Any, Any, R]]) -> R:
        # The limiter learns from every answer that passes through, whichever run sent it.
        async with waiting_for_slot():
            ticket = await limiter.acquire()
        try:
            result = await call()
        except BaseException as exc:
            limiter.release(ticket, exc)
            raise
        limiter.release(ticket, None)
        return result

    @property
    def limiter(self) -> AdaptiveLimiter | None:
        """The shared adaptive limit (its ``limit``, ``changes``), once a request used it; else ``None``.

        Around a pool it is the sum of the replicas' own limits (see `RoutedBackend._adaptive_limit`).
        """
        return self._limiter

    def _adaptive_limit(
        self, settings: AdaptiveConcurrency, on_change: Callable[[int, ChangeReason], None] | None = None
    ) -> AdaptiveLimiter:
        """The adaptive limit a run holds this backend's attempts to: the wrapped backend's own way.

        Around a pool, the sum of its per-replica limits; around any other backend, a fresh limit.
        """
        return adaptive_limiter(self.backend, settings, on_change)


class LimitedRollingBackend(LimitedBackend, ForwardingRolling):
    """A `LimitedBackend` around a backend that has ``loglikelihood_rolling``."""


def limited(
    backend: AsyncBackend,
    *,
    concurrency: Concurrency = None,
    rate_limit: RateLimit | None = None,
    timeout: TimeoutOption = None,
    budget: Budget | None = None,
) -> LimitedBackend:
    """Wrap ``backend`` so its limits hold across every run that uses the returned backend.

    Two concurrent `gather` calls on the returned backend share its ``concurrency`` slots and its
    ``rate_limit`` buckets; `gather`'s own ``concurrency`` and ``rate_limit`` stay per run and apply on top.
    Waiting for the shared slots and rates is not counted toward `gather`'s per-attempt timeout.

    Example:
        ```python
        server = ab.limited(ab.create_backend("tgi", url=URL), concurrency=8,
                            rate_limit=ab.RateLimit(requests_per_second=20))
        # Both runs together keep at most 8 requests in flight and start at most 20 a second.
        a, b = await asyncio.gather(ab.gather(server, first), ab.gather(server, second))
        ```

    Args:
        backend: The backend to wrap (any `AsyncBackend`, a wrapper included).
        concurrency: Most requests in flight through the wrapper at once; ``"adaptive"`` (or an
            `AdaptiveConcurrency`) for one adaptive limit that every run's answers move (around a pool, one
            per replica, moved by that replica's answers, the wrapper holding their sum); ``None`` for none.
        rate_limit: Request and token rates shared by every run; ``None`` for none.
        timeout: `Timeouts` (or a plain number: a total) every call through the wrapper keeps, a run's
            attempts and direct calls alike, timed from when the call holds a shared slot; a run's own
            ``timeout`` still applies, the tighter limit winning. ``None``: the wrapper adds none.
        budget: One spending limit (`Budget`) for every run and call through the wrapper: a call whose worst
            case it cannot cover raises `BudgetExceededError` unsent. A cost limit needs the backend's
            `Pricing`. ``None`` for none.

    Returns:
        A backend with the wrapped one's name, capabilities, fingerprint and methods
        (``loglikelihood_rolling`` only where the wrapped backend has it).

    Raises:
        InvalidRequestError: ``concurrency``, ``rate_limit``, ``timeout`` or ``budget`` is not valid.
    """
    cls = LimitedRollingBackend if isinstance(backend, SupportsRollingLoglikelihood) else LimitedBackend
    return cls(backend, concurrency=concurrency, rate_limit=rate_limit, timeout=timeout, budget=budget)
