"""One run of the gathering path: the worker pool behind `gather`, `as_completed` and `run_batch`.

A fixed pool of worker tasks pulls the next ``(index, request)`` from one shared iterator (`_run_feed`: a
sequence, or a caller's generator taken one request per freed slot), so memory stays flat whatever the
number of requests (no task per request up front) and time spent waiting for a slot never counts toward a
timeout. Each request goes through the cache, the rate limits, timed attempts and retries
here, as one `RunOptions` (already checked when it was built) says.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from ._adaptive import AdaptiveLimiter, ChangeReason, Ticket, adaptive_limiter
from ._budget import BudgetGuard, Reservation
from ._cache import ResponseCache, open_cache
from ._clock import AttemptClock
from ._limits import RateBuckets
from ._observability.observe import RequestObserver, RunObserver
from ._options import DEFAULT_CONCURRENCY, RetryPolicy, RunOptions, adaptive_settings, rate_buckets
from ._protocol import REQUEST_METHODS, AsyncBackend, BackendMethod, backend_method
from ._refusals import refuse_unclaimed_adapter
from ._run_cache import misses, settle
from ._run_feed import Gate, Item, counted
from ._run_observed import observed_attempt, watched_one
from ._tasks import all_or_nothing
from ._timeouts import set_idle_timeout
from ._types import (
    Request,
    Result,
)
from ._usage import pricing_of
from .errors import (
    AsyncBackendsError,
    BackendError,
    BackendTimeoutError,
    BudgetExceededError,
    InvalidRequestError,
    RequestRejectedError,
)

__all__ = ["Outcome", "Run"]

Outcome = Result | AsyncBackendsError


class Run:
    """One run: the shared state of its worker pool.

    Args:
        backend: Where the requests go.
        requests: The requests, in order: a sequence, or any iterable, taken one request per freed slot.
        options: How to send them.
        sink: Called with ``(index, outcome)`` as each request ends.
        observer: Told what happens to each request (`_observability.observe`); ``None`` when nothing
            watches, so the hot path pays one check per request.
    """

    def __init__(
        self,
        backend: AsyncBackend,
        requests: Iterable[Request],
        options: RunOptions,
        sink: Callable[[int, Outcome], None],
        observer: RunObserver | None = None,
    ) -> None:
        self.backend, self.sink = backend, sink
        # Results the caller has not read yet (`_run_feed.Gate`), set by a streamed `as_completed` once the
        # concurrency is known: while it is full, no request is taken.
        self.gate: Gate | None = None
        # A sequence's length is known up front (the bar's total); a stream's requests are counted as taken.
        self.total: int | None = len(requests) if isinstance(requests, Sequence) else None
        self.source: Iterator[tuple[int, Request]] = (
            enumerate(requests) if self.total is not None else counted(requests, options.metrics)
        )
        self.items: Iterator[Item] = self.source  # what the workers take: the cache's misses, with one
        hint = backend.capabilities.max_concurrency
        self.adaptive = adaptive_settings(options.concurrency)
        # Adaptive: one worker per slot the limit may reach; the limiter decides how many send at once.
        fixed = options.concurrency if isinstance(options.concurrency, int) else None
        self.concurrency: int = self.adaptive.max if self.adaptive else fixed or hint or DEFAULT_CONCURRENCY
        self.limiter: AdaptiveLimiter | None = None  # loop-bound: made when the run starts
        self.tickets: dict[AttemptClock, Ticket] = {}  # adaptive slots taken by workers, not yet used
        self.retry = options.retry or RetryPolicy()
        self.timeout = options.timeouts.total  # enforced here, by the sweeper
        self.idle = options.timeouts.idle  # enforced by adapters that stream, read through `idle_timeout`
        self.cache_option = options.cache
        self.cache: ResponseCache | None = None
        self.return_exceptions = options.return_exceptions
        self.metrics = options.metrics
        self.progress = options.progress
        self.rates: RateBuckets | None = rate_buckets(options.rate_limit)
        self.bar: Any = None
        self.first_error: AsyncBackendsError | None = None
        self.rng = random.Random()
        self.name = backend.name
        self.methods: dict[type, BackendMethod | None] = {}  # request type -> bound method, looked up once
        self.observer = observer
        self.keys: dict[int, str] = {}  # the cache key of each request handed to a worker, until stored
        self.started = 0.0
        self.pricing = pricing_of(backend)
        # Built here, before anything is sent: a cost budget through a backend with no prices is refused.
        self.budget = None if options.budget is None else BudgetGuard(options.budget, self.pricing)

    async def run(self) -> None:
        """Send every request; return when all ended, or raise the first error (the rest cancelled)."""
        # Opened here, inside the run, so that nothing is opened for a run refused before it starts, and
        # whatever is opened is closed in the `finally` below.
        owns_cache = self.cache_option is not None and not isinstance(self.cache_option, ResponseCache)
        if self.cache_option is not None:
            self.cache = open_cache(self.cache_option)
            self.items = misses(self, self.cache)
        try:
            if self.progress:
                from tqdm.auto import tqdm

                desc = self.progress if isinstance(self.progress, str) else self.name
                # A stream's total is unknown (None): the bar counts up.
                self.bar = tqdm(total=self.total, desc=desc, unit="req", dynamic_ncols=True)
            await self._run_workers()
        finally:
            if self.bar is not None:
                self.bar.close()
            if self.cache is not None:
                # Every result committed before the run returns (a group waits up to its window).
                await settle(self.cache, close=owns_cache)

    async def _run_workers(self) -> None:
        if self.metrics is not None:
            self.metrics.requests += self.total or 0
            self.metrics.started = self.metrics.started or time.perf_counter()
        self.started = time.perf_counter()
        if self.adaptive is not None:
            self.limiter = adaptive_limiter(self.backend, self.adaptive, self.limit_changed)
        if self.metrics is not None:
            self.metrics.concurrency_limit = self.limiter.limit if self.limiter else self.concurrency
        loop = asyncio.get_running_loop()
        timeout = math.inf if self.timeout is None else self.timeout
        workers = self.concurrency if self.total is None else min(self.concurrency, self.total)
        slots = [AttemptClock(timeout) for _ in range(workers)]
        tasks = []
        for slot in slots:
            slot.task = loop.create_task(self.work(slot))
            tasks.append(slot.task)
        sweeper = loop.create_task(self.sweep(slots)) if self.timeout is not None and slots else None
        try:
            # Reached on success, on the first error, and when the caller is cancelled: every in-flight
            # request is cancelled (adapters abort engine requests, close HTTP streams) and awaited.
            await all_or_nothing(tasks)
        except AsyncBackendsError as exc:
            # Raise the first request to fail, not the first failed worker in task order.
            if self.first_error is None or self.first_error is exc:
                raise
            raise self.first_error  # noqa: B904  (its own cause chain is what matters, kept as raised)
        finally:
            if sweeper is not None:
                sweeper.cancel()
            if self.metrics is not None:
                self.metrics.finished = time.perf_counter()
            if self.observer is not None:
                self.observer.run_ended()

    def limit_changed(self, limit: int, reason: ChangeReason) -> None:
        """The adaptive limit moved: into the metrics and to the observer."""
        if self.metrics is not None:
            self.metrics._record_limit(
                time.perf_counter() - (self.metrics.started or self.started), limit, reason
            )
        if self.observer is not None:
            self.observer.concurrency_changed(limit, reason)

    async def within_limit(self, call: Awaitable[Result], slot: AttemptClock) -> Result:
        """Await ``call`` holding a slot of the adaptive limit, and tell the limiter how it went."""
        limiter = self.limiter
        assert limiter is not None
        try:
            ticket = self.tickets.pop(slot, None) or await limiter.acquire()
        except BaseException:
            if asyncio.iscoroutine(call):
                call.close()  # never awaited: say so quietly instead of a "never awaited" warning
            raise
        try:
            result = await call
        except BaseException as exc:
            limiter.release(ticket, exc)
            raise
        limiter.release(ticket, None)
        return result

    async def sweep(self, slots: list[AttemptClock]) -> None:
        """Cancel attempts past their deadline.

        One sweeper per run instead of an ``asyncio.timeout`` per attempt: a timer handle per attempt costs
        more than the attempt itself on a fast backend (heap pushes, and cancelled handles piling up in the
        loop's heap). A timeout fires up to ``resolution`` late: 5% of the timeout, between 1 and 100 ms.
        """
        assert self.timeout is not None
        resolution = min(0.1, max(0.001, self.timeout / 20))
        while True:
            await asyncio.sleep(resolution)
            now = time.monotonic()
            for slot in slots:
                if slot.deadline <= now and not slot.expired and slot.task is not None:
                    slot.expired = True
                    slot.task.cancel()

    async def work(self, slot: AttemptClock) -> None:
        slot.bind()
        set_idle_timeout(self.idle)  # once per worker: every attempt it makes runs in its context
        limiter = self.limiter
        if limiter is None:
            await self.work_on(slot, self.items)
            return
        try:
            while True:
                # Room under the adaptive limit first, then the next request: until the limit lets it go, a
                # request waits in the run's queue (as with a fixed limit), not in its own latency.
                self.tickets[slot] = await limiter.acquire()
                item = next(self.items, None)
                if item is None:
                    return
                await self.work_on(slot, iter((item,)))
                self.give_back(slot)  # a cache hit or a refused request used no attempt
        finally:
            self.give_back(slot)

    def give_back(self, slot: AttemptClock) -> None:
        """Return the worker's unused adaptive slot, if it holds one."""
        ticket = self.tickets.pop(slot, None)
        if ticket is not None and self.limiter is not None:
            self.limiter.release(ticket, asyncio.CancelledError())

    async def work_on(self, slot: AttemptClock, items: Iterator[Item]) -> None:
        sink, metrics, observer, gate = self.sink, self.metrics, self.observer, self.gate
        backlog = None if self.cache is None else self.cache.backlog
        bar = self.bar  # made before the workers start
        timed = metrics is not None or observer is not None
        for index, request in items:
            if gate is not None and (request is None or gate.full()):
                # The caller holds `gate.bound` results unread: send nothing more until it reads some.
                await gate.room()
            if request is None:  # `PAUSE` between cache hits, no request of its own
                continue
            if backlog is not None and backlog.full():
                await backlog.room()  # the cache's writer is that many results behind: let it catch up
            start = time.perf_counter() if timed else 0.0
            key = self.keys.pop(index, None)
            if observer is None:
                outcome = await self.one(request, slot, None, key)
            else:
                outcome = await watched_one(self, observer, index, request, slot, start - self.started, key)
            if isinstance(outcome, AsyncBackendsError) and not self.return_exceptions:
                if self.first_error is None:
                    self.first_error = outcome
                raise outcome
            if metrics is not None:
                metrics._record_outcome(outcome, self.pricing)
            sink(index, outcome)
            if metrics is not None:
                end = time.perf_counter()
                metrics._record_latency(end - start, start - (metrics.started or start))
                if metrics.on_update is not None:
                    metrics.on_update(metrics)
            if bar is not None:
                bar.update(1)
                if isinstance(outcome, AsyncBackendsError):
                    bar.set_postfix(errors=metrics.failed if metrics else "yes", refresh=False)

    async def attempt(
        self, method: BackendMethod, request: Request, slot: AttemptClock, attempt: int
    ) -> Result:
        """One call to the adapter, bounded by the per-attempt timeout (`AttemptClock`)."""
        if self.timeout is None:
            return await method(request)
        slot.timeout, slot.attempt = self.timeout, attempt
        with slot:
            return await method(request)

    async def one(
        self, request: Request, slot: AttemptClock, watched: RequestObserver | None, key: str | None
    ) -> Outcome:
        """One request through rate limits, attempts and retries; returns its result or error.

        ``key``: where its result is stored in the cache (``None``: not cached). Cache hits never get here
        (`_run_cache.misses` delivers them).
        """
        kind = type(request)
        try:
            method = self.methods[kind]
        except KeyError:
            method = self.methods[kind] = backend_method(self.backend, kind)
        if method is None:
            method_name = REQUEST_METHODS.get(kind)
            return InvalidRequestError(
                f"backend {self.name!r} has no {method_name}() for {kind.__name__}"
                if method_name
                else f"not a request: {kind.__name__}; wrap prompts in ab.GenerationRequest"
            )
        if request.adapter is not None and not self.backend.capabilities.adapters:
            try:
                refuse_unclaimed_adapter(request, self.backend.capabilities, backend=self.name)
            except RequestRejectedError as refused:
                return refused
        attempt = 1
        while True:
            if self.rates is not None:
                waiting = time.perf_counter() if watched is not None else 0.0
                await self.rates.take(request)
                if watched is not None:
                    watched.rate_waited(time.perf_counter() - waiting)
            reservation: Reservation | None = None
            if self.budget is not None:
                held = await self.budget.reserve(request)
                if isinstance(held, BudgetExceededError):
                    held.backend = self.name
                    return held
                reservation = held
            error: BackendError
            settled: Result | None = None
            try:
                result: Result
                if watched is None and self.limiter is None:
                    # The adapter's call itself, timed here, not `attempt` around it: one coroutine fewer
                    # per request in flight, promoted to the collector's oldest generation
                    # (docs/benchmarks.md), and one frame fewer on every resumption.
                    if self.timeout is None:
                        result = await method(request)
                    else:
                        slot.attempt = attempt
                        with slot:
                            result = await method(request)
                else:
                    call: Awaitable[Result]
                    if watched is not None:
                        call = observed_attempt(self, watched, method, request, slot, attempt)
                    else:
                        call = self.attempt(method, request, slot, attempt)
                    if self.limiter is not None:
                        call = self.within_limit(call, slot)
                    result = await call
            except InvalidRequestError as exc:
                return exc
            except BackendError as exc:
                error = exc
            except TimeoutError as exc:
                # The adapter's own timeout leaked as a plain TimeoutError: still a timeout, still retryable.
                error = BackendTimeoutError(f"{type(exc).__name__}: {exc}")
                error.__cause__ = exc
            except Exception as exc:
                # An adapter leaked a raw exception: report it as ours, unretried, with the cause attached.
                error = BackendError(f"{type(exc).__name__}: {exc}", retryable=False)
                error.__cause__ = exc
            else:
                settled = result
                if key is not None and self.cache is not None:  # a key is given only to a cached run's
                    self.cache.queue(key, self.name, result)
                return result
            finally:
                if reservation is not None:
                    assert self.budget is not None
                    self.budget.settle(reservation, settled)
            if error.backend is None:
                error.backend = self.name
            if error.request_id is None:
                error.request_id = request.request_id
            if not error.retryable or attempt >= self.retry.max_attempts:
                return error
            if self.metrics is not None:
                self.metrics.retries += 1
                self.metrics.retried_errors[type(error).__name__] += 1
            delay = self.retry.delay(attempt, error, self.rng)
            if watched is not None:
                watched.retrying(attempt, error, delay)
            await asyncio.sleep(delay)
            attempt += 1
