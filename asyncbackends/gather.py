"""The one gathering path: `gather`, `as_completed` and `run_batch` share one engine.

All policy lives here, never in adapters: bounded concurrency, per-attempt timeouts, retries with backoff,
rate limits, the response cache, cancellation, progress and metrics. The engine runs a fixed pool of worker
tasks that pull the next request index from one shared iterator, so memory stays flat whatever the number
of requests (no task per request up front) and time spent waiting for a slot never counts toward a timeout.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from ._tasks import all_or_nothing
from .cache import ResponseCache, open_cache
from .errors import (
    AsyncBackendsError,
    BackendError,
    BackendTimeoutError,
    InvalidRequestError,
    RateLimitedError,
)
from .loop import get_loop_manager
from .metrics import RunMetrics
from .protocol import AsyncBackend
from .types import (
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    Request,
    Result,
    RollingLoglikelihoodRequest,
)

__all__ = ["DEFAULT_CONCURRENCY", "RateLimit", "RetryPolicy", "as_completed", "gather", "run_batch"]

DEFAULT_CONCURRENCY = 64
"""In-flight requests when neither the caller nor the backend's capabilities say."""

_METHODS: dict[type, str] = {
    GenerationRequest: "generate",
    LoglikelihoodRequest: "loglikelihood",
    RollingLoglikelihoodRequest: "loglikelihood_rolling",
}


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How `gather` retries a failed attempt whose error has ``retryable`` set.

    Delays grow exponentially from ``initial_delay`` and are capped at ``max_delay``; with ``jitter`` each is
    drawn uniformly from zero to that value ("full jitter"), so many failed requests do not retry in step. A
    `RateLimitedError` with ``retry_after`` waits at least that long, capped at ``max_delay``.

    Args:
        max_attempts: Attempts per request, the first one included (1 disables retries).
        initial_delay: Seconds before the second attempt (before jitter).
        max_delay: Cap on any one delay, ``Retry-After`` included.
        jitter: Draw each delay uniformly from [0, delay].
    """

    max_attempts: int = 3
    initial_delay: float = 0.5
    max_delay: float = 30.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InvalidRequestError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if self.initial_delay < 0 or self.max_delay < 0:
            raise InvalidRequestError("initial_delay and max_delay must be >= 0")

    def delay(self, failed_attempt: int, error: BaseException, rng: random.Random | None = None) -> float:
        """Seconds to wait after attempt number ``failed_attempt`` (1-based) failed with ``error``."""
        delay = float(min(self.max_delay, self.initial_delay * 2.0 ** (failed_attempt - 1)))
        if self.jitter:
            delay = float((rng or random).uniform(0, delay))
        if isinstance(error, RateLimitedError) and error.retry_after is not None:
            delay = max(delay, min(error.retry_after, self.max_delay))
        return delay


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Client-side rate limits, enforced by token buckets shared by one run's workers.

    Args:
        requests_per_second: Most requests started per second (bursts of up to one second's worth).
        tokens_per_minute: Most tokens per minute, each request counted before it is sent as its prompt's
            estimated size (token ids counted, text at four characters a token) plus ``max_tokens * n``.
    """

    requests_per_second: float | None = None
    tokens_per_minute: float | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_second", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise InvalidRequestError(f"{name} must be > 0 or None, got {value!r}")


class _TokenBucket:
    """A token bucket; callers queue on a lock so waiting workers are served in order."""

    def __init__(self, rate_per_s: float, capacity: float) -> None:
        self.rate, self.capacity = rate_per_s, capacity
        self.tokens = capacity
        self.stamp = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self, amount: float) -> None:
        amount = min(amount, self.capacity)
        async with self.lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= amount:
                    self.tokens -= amount
                    return
                await asyncio.sleep((amount - self.tokens) / self.rate)


def _estimated_tokens(request: Request) -> float:
    if isinstance(request, GenerationRequest):
        prompt = request.prompt
        size: float
        if isinstance(prompt, str):
            size = len(prompt) / 4
        elif request.prompt_kind == "tokens":
            size = len(prompt)
        else:
            size = sum(len(str(m.get("content", ""))) for m in prompt if isinstance(m, Mapping)) / 4
        return size + request.params.max_tokens * request.params.n
    if isinstance(request, LoglikelihoodRequest):
        return (len(request.context) + len(request.continuation)) / 4 + 1
    return len(request.text) / 4 + 1


Outcome = Result | AsyncBackendsError


def _check_options(concurrency: object, retry: object, timeout: object, rate_limit: object) -> None:
    """Refuse bad gathering options before anything is sent."""
    if concurrency is not None and (
        not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
    ):
        raise InvalidRequestError(f"concurrency must be an int >= 1 or None, got {concurrency!r}")
    if timeout is not None and (
        not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0
    ):
        raise InvalidRequestError(f"timeout must be a number > 0 or None, got {timeout!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise InvalidRequestError(f"retry must be a RetryPolicy or None, got {type(retry).__name__}")
    if rate_limit is not None and not isinstance(rate_limit, RateLimit):
        raise InvalidRequestError(f"rate_limit must be a RateLimit or None, got {type(rate_limit).__name__}")


class _Slot:
    """One worker's current attempt deadline (monotonic seconds), read by the run's sweeper."""

    __slots__ = ("deadline", "expired", "task")

    def __init__(self) -> None:
        self.deadline = math.inf
        self.expired = False
        self.task: asyncio.Task[None] | None = None


class _Engine:
    """One run: shared state of the worker pool."""

    def __init__(
        self,
        backend: AsyncBackend,
        requests: Sequence[Request],
        *,
        sink: Callable[[int, Outcome], None],
        concurrency: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        rate_limit: RateLimit | None = None,
        progress: bool | str = False,
        cache: ResponseCache | None = None,
        return_exceptions: bool = False,
        metrics: RunMetrics | None = None,
        owns_cache: bool = False,
    ) -> None:
        _check_options(concurrency, retry, timeout, rate_limit)
        self.backend, self.requests, self.sink = backend, requests, sink
        hint = getattr(getattr(backend, "capabilities", None), "max_concurrency", None)
        self.concurrency = concurrency or hint or DEFAULT_CONCURRENCY
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self.cache, self.owns_cache = cache, owns_cache
        self.return_exceptions = return_exceptions
        self.metrics = metrics
        self.rps = self.tpm = None
        if rate_limit is not None:
            if rate_limit.requests_per_second:
                rps = rate_limit.requests_per_second
                self.rps = _TokenBucket(rps, max(1.0, rps))
            if rate_limit.tokens_per_minute:
                tpm = rate_limit.tokens_per_minute
                self.tpm = _TokenBucket(tpm / 60, tpm)
        self.bar: Any = None
        if progress:
            from tqdm.auto import tqdm

            desc = progress if isinstance(progress, str) else getattr(backend, "name", "requests")
            self.bar = tqdm(total=len(requests), desc=desc, unit="req", dynamic_ncols=True)
        self.indices = iter(range(len(requests)))
        self.first_error: AsyncBackendsError | None = None
        self.rng = random.Random()
        self.name = getattr(backend, "name", type(backend).__name__)

    async def run(self) -> None:
        if self.metrics is not None:
            self.metrics.requests += len(self.requests)
            self.metrics.started = self.metrics.started or time.perf_counter()
        loop = asyncio.get_running_loop()
        slots = [_Slot() for _ in range(min(self.concurrency, len(self.requests)))]
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
            if self.bar is not None:
                self.bar.close()
            if self.owns_cache and self.cache is not None:
                self.cache.close()
            if self.metrics is not None:
                self.metrics.finished = time.perf_counter()

    async def sweep(self, slots: list[_Slot]) -> None:
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

    async def work(self, slot: _Slot) -> None:
        requests, sink, metrics = self.requests, self.sink, self.metrics
        for index in self.indices:
            request = requests[index]
            start = time.perf_counter() if metrics is not None else 0.0
            outcome = await self.one(request, slot)
            if isinstance(outcome, AsyncBackendsError):
                if not self.return_exceptions:
                    if self.first_error is None:
                        self.first_error = outcome
                    raise outcome
                if metrics is not None:
                    metrics.errors[type(outcome).__name__] += 1
            elif metrics is not None:
                metrics.successes += 1
                if isinstance(outcome, GenerationResult):
                    metrics.prompt_tokens += outcome.prompt_tokens or 0
                    metrics.completion_tokens += outcome.completion_tokens
            sink(index, outcome)
            if metrics is not None:
                end = time.perf_counter()
                metrics._record_latency(end - start, start - (metrics.started or start))
                if metrics.on_update is not None:
                    metrics.on_update(metrics)
            if self.bar is not None:
                self.bar.update(1)
                if isinstance(outcome, AsyncBackendsError):
                    self.bar.set_postfix(errors=metrics.failed if metrics else "yes", refresh=False)

    async def attempt(self, method: Any, request: Request, slot: _Slot, attempt: int) -> Result:
        """One call to the adapter, bounded by the per-attempt timeout.

        An attempt the sweeper cancelled raises `BackendTimeoutError` whatever the adapter turned the
        cancellation into (an adapter may map it to its own error, or an engine abort may fail), and the
        task's cancellation count is restored, so the next attempt is timed again.
        """
        if self.timeout is None:
            return await method(request)  # type: ignore[no-any-return]
        slot.deadline = time.monotonic() + self.timeout
        try:
            result: Result = await method(request)
        except BaseException as exc:
            if not slot.expired:
                raise
            slot.expired = False
            if asyncio.current_task().uncancel() > 0:  # type: ignore[union-attr]
                raise asyncio.CancelledError from exc  # cancelled from outside as well: that wins
            cause = None if isinstance(exc, asyncio.CancelledError) else exc
            raise BackendTimeoutError(f"attempt {attempt} took longer than {self.timeout} s") from cause
        finally:
            slot.deadline = math.inf
        if slot.expired:  # the adapter swallowed our cancellation and answered anyway
            slot.expired = False
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        return result

    async def one(self, request: Request, slot: _Slot) -> Outcome:
        """One request through cache, rate limits, attempts and retries; returns its result or error."""
        method_name = _METHODS.get(type(request))
        method = getattr(self.backend, method_name, None) if method_name else None
        if method is None:
            return InvalidRequestError(
                f"backend {self.name!r} has no {method_name}() for {type(request).__name__}"
                if method_name
                else f"not a request: {type(request).__name__}; wrap prompts in ab.GenerationRequest"
            )
        if self.cache is not None:
            cached = await self.cache.aget(self.backend, request)
            if cached is not None:
                if self.metrics is not None:
                    self.metrics.cache_hits += 1
                return cached
        attempt = 1
        while True:
            if self.rps is not None:
                await self.rps.take(1)
            if self.tpm is not None:
                await self.tpm.take(_estimated_tokens(request))
            error: BackendError
            try:
                result: Result = await self.attempt(method, request, slot, attempt)
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
                if self.cache is not None:
                    await self.cache.aput(self.backend, request, result)
                return result
            if error.backend is None:
                error.backend = self.name
            if error.request_id is None:
                error.request_id = request.request_id
            if not error.retryable or attempt >= self.retry.max_attempts:
                return error
            if self.metrics is not None:
                self.metrics.retries += 1
                self.metrics.retried_errors[type(error).__name__] += 1
            await asyncio.sleep(self.retry.delay(attempt, error, self.rng))
            attempt += 1


def _as_sequence(requests: Iterable[Request]) -> Sequence[Request]:
    if isinstance(requests, (str, bytes)):
        raise InvalidRequestError("requests must be a sequence of request objects, not a string")
    return requests if isinstance(requests, Sequence) else list(requests)


def _engine_options(**options: Any) -> dict[str, Any]:
    # Checked before a cache file is opened, so a refused run leaves no file and no open connection.
    _check_options(*(options.get(k) for k in ("concurrency", "retry", "timeout", "rate_limit")))
    cache = options.get("cache")
    if cache is not None and not isinstance(cache, ResponseCache):
        options["cache"] = open_cache(cache)
        options["owns_cache"] = True  # opened from a path here, so closed here when the run ends
    return options


async def _gather_here(backend: AsyncBackend, requests: Sequence[Request], **options: Any) -> list[Any]:
    results: list[Any] = [None] * len(requests)

    def store(index: int, outcome: Outcome) -> None:
        results[index] = outcome

    await _Engine(backend, requests, sink=store, **_engine_options(**options)).run()
    return results


@overload
async def gather(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: int | None = ...,
    retry: RetryPolicy | None = ...,
    timeout: float | None = ...,
    rate_limit: RateLimit | None = ...,
    progress: bool | str = ...,
    cache: Any = ...,
    return_exceptions: Literal[False] = ...,
    metrics: RunMetrics | None = ...,
) -> list[Result]: ...
@overload
async def gather(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: int | None = ...,
    retry: RetryPolicy | None = ...,
    timeout: float | None = ...,
    rate_limit: RateLimit | None = ...,
    progress: bool | str = ...,
    cache: Any = ...,
    return_exceptions: bool = ...,
    metrics: RunMetrics | None = ...,
) -> list[Result | AsyncBackendsError]: ...
async def gather(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: int | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    rate_limit: RateLimit | None = None,
    progress: bool | str = False,
    cache: Any = None,
    return_exceptions: bool = False,
    metrics: RunMetrics | None = None,
) -> list[Any]:
    """Send every request to ``backend`` and return one outcome per request, in input order.

    Runs on the shared loop whichever loop awaits it: from another loop (a notebook, ``asyncio.run``) the
    work is handed to the shared loop and its result awaited here. Cancelling the caller cancels every
    in-flight request.

    Args:
        backend: Any object with the `AsyncBackend` members.
        requests: `GenerationRequest`, `LoglikelihoodRequest` and `RollingLoglikelihoodRequest` objects,
            mixed freely: each goes to the matching backend method.
        concurrency: Most requests in flight; ``None`` takes ``backend.capabilities.max_concurrency``, else
            `DEFAULT_CONCURRENCY`.
        retry: Retry policy for retryable errors; ``None`` means ``RetryPolicy()``.
        timeout: Seconds allowed per attempt (waiting for a slot does not count); ``None`` for no limit.
        rate_limit: Client-side request and token rate limits.
        progress: Show a tqdm bar (``True``, or a ``str`` for its label).
        cache: A `ResponseCache` or a path to one: results found there are not sent again, new ones are
            written as they arrive, so a killed run resumes where it stopped.
        return_exceptions: Return a failed request's error in its place instead of raising.
        metrics: A `RunMetrics` to fill in as the run goes.

    Returns:
        One `GenerationResult` / `LoglikelihoodResult` per request, or its error with ``return_exceptions``.

    Raises:
        AsyncBackendsError: Without ``return_exceptions``, the first failure, after cancelling the rest.
    """
    sequence = _as_sequence(requests)
    options = dict(
        concurrency=concurrency,
        retry=retry,
        timeout=timeout,
        rate_limit=rate_limit,
        progress=progress,
        cache=cache,
        return_exceptions=return_exceptions,
        metrics=metrics,
    )
    return await get_loop_manager().arun(_gather_here(backend, sequence, **options))


def run_batch(backend: AsyncBackend, requests: Iterable[Request], **options: Any) -> list[Any]:
    """The blocking twin of `gather` for sync code: same arguments, same result.

    Every call reuses the one shared loop, so calling it once per batch (as lm-eval and lighteval do) is
    safe. Ctrl-C cancels the in-flight requests and raises ``KeyboardInterrupt``.

    Raises:
        LoopError: Called from the shared loop's own thread.
    """
    sequence = _as_sequence(requests)
    return get_loop_manager().run(_gather_here(backend, sequence, **options))


async def as_completed(
    backend: AsyncBackend, requests: Iterable[Request], **options: Any
) -> AsyncIterator[tuple[int, Any]]:
    """Yield ``(index, outcome)`` as each request finishes, whatever the order; same arguments as `gather`.

    Closing the iterator cancels the requests still in flight. A ``break`` alone leaves the closing to the
    garbage collector; wrap the call in ``contextlib.aclosing(...)`` to cancel at once.

    Raises:
        AsyncBackendsError: Without ``return_exceptions``, the first failure, after cancelling the rest.
    """
    sequence = _as_sequence(requests)
    manager = get_loop_manager()
    here = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    same_loop = here is manager.loop

    def put(index: int, outcome: Outcome) -> None:
        if same_loop:
            queue.put_nowait((index, outcome))
        else:
            here.call_soon_threadsafe(queue.put_nowait, (index, outcome))

    engine = _Engine(backend, sequence, sink=put, **_engine_options(**options))
    task = asyncio.ensure_future(manager.arun(engine.run()))
    try:
        for _ in range(len(sequence)):
            if queue.empty():
                # Items are queued before the run's completion is signalled, so an empty queue and a
                # finished run mean the run failed: raise its error rather than wait forever.
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait([getter, task], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    task.result()
                    raise AssertionError(
                        "gathering engine ended before yielding every result"
                    )  # pragma: no cover
                yield getter.result()
            else:
                yield queue.get_nowait()
        await task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
