"""The one gathering path: `gather`, `as_completed` and `run_batch` share one run.

All policy lives beneath these entry points, never in adapters: bounded concurrency, per-attempt
timeouts, retries with backoff, rate limits, the response cache, cancellation, progress and metrics. The
keyword arguments build one `RunOptions` (checked before anything is sent); one run's worker pool is
`asyncbackends._run.Run` (memory flat whatever the number of requests, waiting for a slot never counted
toward a timeout).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Literal, Never, overload

from ._batch_run import BatchRun
from ._cache import ResponseCache
from ._loop import get_loop_manager
from ._observability.callbacks import RunCallbacks
from ._observability.observe import RunObserver
from ._observability.observers import watch
from ._observability.run_metrics import RunMetrics
from ._options import DEFAULT_CONCURRENCY as DEFAULT_CONCURRENCY
from ._options import OPTION_NAMES, Concurrency, refuse_unknown_options
from ._options import RateLimit as RateLimit
from ._options import RetryPolicy as RetryPolicy
from ._options import RunOptions as RunOptions
from ._protocol import AsyncBackend
from ._run import Outcome, Run
from ._timeouts import DEFAULT_TIMEOUTS, TimeoutOption
from ._types import Request, Result
from .errors import AsyncBackendsError, InvalidRequestError

__all__ = ["as_completed", "gather", "run_batch"]

CacheOption = ResponseCache | str | os.PathLike[str] | None


def _as_sequence(requests: Iterable[Request]) -> Sequence[Request]:
    if isinstance(requests, (str, bytes)):
        raise InvalidRequestError("requests must be a sequence of request objects, not a string")
    return requests if isinstance(requests, Sequence) else list(requests)


def _checked(arguments: Mapping[str, Any]) -> tuple[RunOptions, Sequence[Request]]:
    """An entry point's call checked before anything is sent: its `RunOptions` and its requests.

    ``arguments`` is the entry point's ``locals()`` on entry, the options read by name (the keyword
    arguments every entry point takes are `RunOptions`' fields, and its ``**unknown`` the misspelled ones).
    """
    refuse_unknown_options(arguments["unknown"])
    options = RunOptions(**{name: arguments[name] for name in OPTION_NAMES})
    return options, _as_sequence(arguments["requests"])


def _runner(options: RunOptions) -> type[Run] | type[BatchRun]:
    return BatchRun if options.batch else Run


async def _gather_here(
    backend: AsyncBackend, requests: Sequence[Request], options: RunOptions, observer: RunObserver | None
) -> list[Any]:
    results: list[Any] = [None] * len(requests)

    def store(index: int, outcome: Outcome) -> None:
        results[index] = outcome

    await _runner(options)(backend, requests, options, store, observer).run()
    return results


@overload
async def gather(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: Concurrency = ...,
    retry: RetryPolicy | None = ...,
    timeout: TimeoutOption = ...,
    rate_limit: RateLimit | None = ...,
    progress: bool | str = ...,
    cache: CacheOption = ...,
    return_exceptions: Literal[False] = ...,
    metrics: RunMetrics | None = ...,
    callbacks: RunCallbacks | None = ...,
    batch: bool = ...,
) -> list[Result]: ...
@overload
async def gather(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: Concurrency = ...,
    retry: RetryPolicy | None = ...,
    timeout: TimeoutOption = ...,
    rate_limit: RateLimit | None = ...,
    progress: bool | str = ...,
    cache: CacheOption = ...,
    return_exceptions: bool = ...,
    metrics: RunMetrics | None = ...,
    callbacks: RunCallbacks | None = ...,
    batch: bool = ...,
) -> list[Result | AsyncBackendsError]: ...
async def gather(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: Concurrency = None,
    retry: RetryPolicy | None = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUTS,
    rate_limit: RateLimit | None = None,
    progress: bool | str = False,
    cache: CacheOption = None,
    return_exceptions: bool = False,
    metrics: RunMetrics | None = None,
    callbacks: RunCallbacks | None = None,
    batch: bool = False,
    **unknown: Never,
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
            `DEFAULT_CONCURRENCY`; ``"adaptive"`` (or an `AdaptiveConcurrency` for its settings) lowers the
            limit on rate-limit and overload answers, raises it on clean rounds and holds it when queueing
            delay grows.
        retry: Retry policy for retryable errors; ``None`` means ``RetryPolicy()``.
        timeout: Per-attempt limits, an `ab.Timeouts`: by default no total and 120 s without a byte or
            token (a generation that streams runs as long as it produces); a plain number is a total alone,
            as before (waiting for a slot does not count); ``None`` for no limit at all.
        rate_limit: Client-side request and token rate limits.
        progress: Show a tqdm bar (``True``, or a ``str`` for its label).
        cache: A `ResponseCache` or a path to one: results found there are not sent again, new ones are
            written as they arrive, so a killed run resumes where it stopped.
        return_exceptions: Return a failed request's error in its place instead of raising.
        metrics: A `RunMetrics` to fill in as the run goes.
        callbacks: A `RunCallbacks` whose functions are called as requests end, retry and use tokens.
        batch: Send generation requests through the backend's provider batch API (``openai``: OpenAI's
            Files + Batches API, half the price); with a ``cache``, a killed run started again polls its
            batches instead of sending them again (docs/batches.md).
        **unknown: Refused: any other keyword is a misspelled option (typed ``Never`` so mypy flags it too).

    Returns:
        One `GenerationResult` / `LoglikelihoodResult` per request, or its error with ``return_exceptions``.

    Raises:
        InvalidRequestError: An option is unknown (the closest valid one is named) or has a bad value.
        AsyncBackendsError: Without ``return_exceptions``, the first failure, after cancelling the rest.
    """
    options, sequence = _checked(locals())
    # The observer is made here, in the caller's thread, where the caller's active span is current.
    return await get_loop_manager().arun(_gather_here(backend, sequence, options, watch(backend, options)))


@overload
def run_batch(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: Concurrency = ...,
    retry: RetryPolicy | None = ...,
    timeout: TimeoutOption = ...,
    rate_limit: RateLimit | None = ...,
    progress: bool | str = ...,
    cache: CacheOption = ...,
    return_exceptions: Literal[False] = ...,
    metrics: RunMetrics | None = ...,
    callbacks: RunCallbacks | None = ...,
    batch: bool = ...,
) -> list[Result]: ...
@overload
def run_batch(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: Concurrency = ...,
    retry: RetryPolicy | None = ...,
    timeout: TimeoutOption = ...,
    rate_limit: RateLimit | None = ...,
    progress: bool | str = ...,
    cache: CacheOption = ...,
    return_exceptions: bool = ...,
    metrics: RunMetrics | None = ...,
    callbacks: RunCallbacks | None = ...,
    batch: bool = ...,
) -> list[Result | AsyncBackendsError]: ...
def run_batch(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: Concurrency = None,
    retry: RetryPolicy | None = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUTS,
    rate_limit: RateLimit | None = None,
    progress: bool | str = False,
    cache: CacheOption = None,
    return_exceptions: bool = False,
    metrics: RunMetrics | None = None,
    callbacks: RunCallbacks | None = None,
    batch: bool = False,
    **unknown: Never,
) -> list[Any]:
    """The blocking twin of `gather` for sync code: same arguments, same result.

    Every call reuses the one shared loop, so calling it once per batch (as lm-eval and lighteval do) is
    safe. Ctrl-C cancels the in-flight requests and raises ``KeyboardInterrupt``.

    Raises:
        InvalidRequestError: An option is unknown (the closest valid one is named) or has a bad value.
        LoopError: Called from the shared loop's own thread, or the manager was shut down meanwhile.
    """
    options, sequence = _checked(locals())
    return get_loop_manager().run(_gather_here(backend, sequence, options, watch(backend, options)))


@overload
def as_completed(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: Concurrency = ...,
    retry: RetryPolicy | None = ...,
    timeout: TimeoutOption = ...,
    rate_limit: RateLimit | None = ...,
    progress: bool | str = ...,
    cache: CacheOption = ...,
    return_exceptions: Literal[False] = ...,
    metrics: RunMetrics | None = ...,
    callbacks: RunCallbacks | None = ...,
    batch: bool = ...,
) -> AsyncIterator[tuple[int, Result]]: ...
@overload
def as_completed(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: Concurrency = ...,
    retry: RetryPolicy | None = ...,
    timeout: TimeoutOption = ...,
    rate_limit: RateLimit | None = ...,
    progress: bool | str = ...,
    cache: CacheOption = ...,
    return_exceptions: bool = ...,
    metrics: RunMetrics | None = ...,
    callbacks: RunCallbacks | None = ...,
    batch: bool = ...,
) -> AsyncIterator[tuple[int, Result | AsyncBackendsError]]: ...
async def as_completed(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    concurrency: Concurrency = None,
    retry: RetryPolicy | None = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUTS,
    rate_limit: RateLimit | None = None,
    progress: bool | str = False,
    cache: CacheOption = None,
    return_exceptions: bool = False,
    metrics: RunMetrics | None = None,
    callbacks: RunCallbacks | None = None,
    batch: bool = False,
    **unknown: Never,
) -> AsyncIterator[tuple[int, Any]]:
    """Yield ``(index, outcome)`` as each request finishes, whatever the order; same arguments as `gather`.

    Closing the iterator cancels the requests still in flight. A ``break`` alone leaves the closing to the
    garbage collector; wrap the call in ``contextlib.aclosing(...)`` to cancel at once.

    Raises:
        InvalidRequestError: An option is unknown (the closest valid one is named) or has a bad value.
        AsyncBackendsError: Without ``return_exceptions``, the first failure, after cancelling the rest.
    """
    options, sequence = _checked(locals())
    manager = get_loop_manager()
    here = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    same_loop = here is manager.loop

    def put(index: int, outcome: Outcome) -> None:
        if same_loop:
            queue.put_nowait((index, outcome))
        else:
            here.call_soon_threadsafe(queue.put_nowait, (index, outcome))

    run = _runner(options)(backend, sequence, options, put, watch(backend, options))
    task = asyncio.ensure_future(manager.arun(run.run()))
    getter: asyncio.Future[tuple[int, Any]] | None = None
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
                    raise AssertionError("the run ended before yielding every result")  # pragma: no cover
                yield getter.result()
            else:
                yield queue.get_nowait()
        await task
    finally:
        # Cancelled while waiting (Ctrl-C on the CLI): the getter would otherwise stay pending on a loop that
        # does not sweep up tasks, and be reported as "Task was destroyed but it is pending!" when collected.
        if getter is not None and not getter.done():
            getter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
