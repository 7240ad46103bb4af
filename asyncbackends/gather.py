"""The one gathering path: `gather`, `as_completed` and `run_batch` share one engine.

All policy lives here, never in adapters: bounded concurrency, per-attempt timeouts, retries with backoff,
rate limits, the response cache, cancellation, progress and metrics. This module holds the policy objects
and the entry points, checks the options and resolves their defaults; one run's worker pool is
`asyncbackends._engine.Engine` (memory flat whatever the number of requests, waiting for a slot never
counted toward a timeout).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from ._engine import Engine, Outcome
from .cache import ResponseCache, open_cache
from .callbacks import RunCallbacks
from .errors import AsyncBackendsError, InvalidRequestError, RateLimitedError
from .loop import get_loop_manager
from .metrics import RunMetrics
from .protocol import AsyncBackend
from .telemetry import capture_context
from .types import Request, Result

__all__ = ["DEFAULT_CONCURRENCY", "RateLimit", "RetryPolicy", "as_completed", "gather", "run_batch"]

DEFAULT_CONCURRENCY = 64
"""In-flight requests when neither the caller nor the backend's capabilities say."""


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


def _as_sequence(requests: Iterable[Request]) -> Sequence[Request]:
    if isinstance(requests, (str, bytes)):
        raise InvalidRequestError("requests must be a sequence of request objects, not a string")
    return requests if isinstance(requests, Sequence) else list(requests)


def _engine_options(backend: AsyncBackend, **options: Any) -> dict[str, Any]:
    # Checked before a cache file is opened, so a refused run leaves no file and no open connection.
    _check_options(*(options.get(k) for k in ("concurrency", "retry", "timeout", "rate_limit")))
    callbacks = options.get("callbacks")
    if callbacks is not None and not isinstance(callbacks, RunCallbacks):
        raise InvalidRequestError(f"callbacks must be a RunCallbacks or None, got {type(callbacks).__name__}")
    hint = getattr(getattr(backend, "capabilities", None), "max_concurrency", None)
    options["concurrency"] = options.get("concurrency") or hint or DEFAULT_CONCURRENCY
    options["retry"] = options.get("retry") or RetryPolicy()
    cache = options.get("cache")
    if cache is not None and not isinstance(cache, ResponseCache):
        options["cache"] = open_cache(cache)
        options["owns_cache"] = True  # opened from a path here, so closed here when the run ends
    return options


async def _gather_here(backend: AsyncBackend, requests: Sequence[Request], **options: Any) -> list[Any]:
    results: list[Any] = [None] * len(requests)

    def store(index: int, outcome: Outcome) -> None:
        results[index] = outcome

    await Engine(backend, requests, sink=store, **_engine_options(backend, **options)).run()
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
    callbacks: RunCallbacks | None = ...,
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
    callbacks: RunCallbacks | None = ...,
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
    callbacks: RunCallbacks | None = None,
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
        callbacks: A `RunCallbacks` whose functions are called as requests end, retry and use tokens.

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
        callbacks=callbacks,
        parent_context=capture_context(),
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
    options.setdefault("parent_context", capture_context())
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

    options.setdefault("parent_context", capture_context())
    engine = Engine(backend, sequence, sink=put, **_engine_options(backend, **options))
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
