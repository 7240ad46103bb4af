"""The one gathering path: `gather`, `as_completed` and `run_batch` share one run.

All policy lives beneath these entry points, never in adapters: bounded concurrency, per-attempt
timeouts, retries with backoff, rate limits, the response cache, cancellation, progress and metrics. Each
entry point takes the run options once, as ``**options: Unpack[RunOptionsKwargs]`` (PEP 692), and builds one
`RunOptions` from them and ``return_exceptions`` (checked before anything is sent); one run's worker pool is
`asyncbackends._run.Run` (memory flat whatever the number of requests, waiting for a slot never counted
toward a timeout).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, Literal, Unpack, overload

from ._batch_run import BatchRun
from ._loop import get_loop_manager
from ._observability.observe import RunObserver
from ._observability.observers import watch
from ._options import RetryPolicy as RetryPolicy
from ._options import RunOptions, RunOptionsKwargs, refuse_unknown_options
from ._protocol import AsyncBackend
from ._run import Outcome, Run
from ._run_feed import Gate
from ._types import Request, Result
from .errors import AsyncBackendsError, InvalidRequestError

__all__ = ["as_completed", "gather", "run_batch"]


def _as_sequence(requests: Iterable[Request]) -> Sequence[Request]:
    if isinstance(requests, (str, bytes)):
        raise InvalidRequestError("requests must be a sequence of request objects, not a string")
    return requests if isinstance(requests, Sequence) else list(requests)


def _run_options(return_exceptions: bool, options: RunOptionsKwargs) -> RunOptions:
    """An entry point's options checked before anything is sent.

    Raises:
        InvalidRequestError: An option is unknown (a misspelling mypy did not see) or has a bad value.
    """
    refuse_unknown_options(options)
    return RunOptions(return_exceptions=return_exceptions, **options)


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
    return_exceptions: Literal[False] = ...,
    **options: Unpack[RunOptionsKwargs],
) -> list[Result]: ...
@overload
async def gather(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    return_exceptions: bool = ...,
    **options: Unpack[RunOptionsKwargs],
) -> list[Result | AsyncBackendsError]: ...
async def gather(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    return_exceptions: bool = False,
    **options: Unpack[RunOptionsKwargs],
) -> list[Any]:
    """Send every request to ``backend`` and return one outcome per request, in input order.

    Runs on the shared loop whichever loop awaits it: from another loop (a notebook, ``asyncio.run``) the
    work is handed to the shared loop and its result awaited here. Cancelling the caller cancels every
    in-flight request.

    Args:
        backend: Any object with the `AsyncBackend` members.
        requests: `GenerationRequest`, `LoglikelihoodRequest` and `RollingLoglikelihoodRequest` objects,
            mixed freely: each goes to the matching backend method.
        return_exceptions: Return a failed request's error in its place instead of raising.
        **options: The run options (`RunOptionsKwargs`, each documented on `RunOptions`): ``concurrency``
            (most requests in flight; ``None`` takes ``backend.capabilities.max_concurrency``, else
            `DEFAULT_CONCURRENCY`; ``"adaptive"`` or an `AdaptiveConcurrency` lowers the limit on rate-limit
            and overload answers, raises it on clean rounds and holds it when queueing delay grows),
            ``retry`` (``None`` means ``RetryPolicy()``), ``timeout`` (per-attempt `ab.Timeouts`: by
            default no total and 120 s without a byte or token; a number is a total; waiting for a slot
            does not count), ``rate_limit``, ``progress`` (a tqdm bar), ``cache`` (a `ResponseCache` or a
            path: results found there are not sent again, so a killed run resumes where it stopped),
            ``metrics`` (a `RunMetrics`) and ``callbacks`` (a `RunCallbacks`). Any other keyword is a
            misspelled option: mypy flags it, and the call raises before anything is sent.

    Returns:
        One `GenerationResult` / `LoglikelihoodResult` per request, or its error with ``return_exceptions``.
        A list: the requests (a generator is read into one first) and their results are all held, so memory
        grows with N. For a run too large for that, pass a generator to `as_completed`, which streams it.

    Raises:
        InvalidRequestError: An option is unknown (the closest valid one is named) or has a bad value.
        AsyncBackendsError: Without ``return_exceptions``, the first failure, after cancelling the rest.
    """
    run_options = _run_options(return_exceptions, options)
    sequence = _as_sequence(requests)
    # The observer is made here, in the caller's thread, where the caller's active span is current.
    return await get_loop_manager().arun(
        _gather_here(backend, sequence, run_options, watch(backend, run_options))
    )


@overload
def run_batch(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    return_exceptions: Literal[False] = ...,
    **options: Unpack[RunOptionsKwargs],
) -> list[Result]: ...
@overload
def run_batch(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    return_exceptions: bool = ...,
    **options: Unpack[RunOptionsKwargs],
) -> list[Result | AsyncBackendsError]: ...
def run_batch(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    return_exceptions: bool = False,
    **options: Unpack[RunOptionsKwargs],
) -> list[Any]:
    """The blocking twin of `gather` for sync code: same arguments, same result.

    Every call reuses the one shared loop, so calling it once per batch (as lm-eval and lighteval do) is
    safe. Ctrl-C cancels the in-flight requests and raises ``KeyboardInterrupt``.

    Raises:
        InvalidRequestError: An option is unknown (the closest valid one is named) or has a bad value.
        LoopError: Called from the shared loop's own thread, or the manager was shut down meanwhile.
    """
    run_options = _run_options(return_exceptions, options)
    sequence = _as_sequence(requests)
    return get_loop_manager().run(_gather_here(backend, sequence, run_options, watch(backend, run_options)))


@overload
def as_completed(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    return_exceptions: Literal[False] = ...,
    **options: Unpack[RunOptionsKwargs],
) -> AsyncIterator[tuple[int, Result]]: ...
@overload
def as_completed(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    return_exceptions: bool = ...,
    **options: Unpack[RunOptionsKwargs],
) -> AsyncIterator[tuple[int, Result | AsyncBackendsError]]: ...
async def as_completed(
    backend: AsyncBackend,
    requests: Iterable[Request],
    *,
    return_exceptions: bool = False,
    **options: Unpack[RunOptionsKwargs],
) -> AsyncIterator[tuple[int, Any]]:
    """Yield ``(index, outcome)`` as each request finishes, whatever the order; same arguments as `gather`.

    ``requests`` may be a generator (any iterable that is not a sequence): it is then streamed, taken one
    request per freed slot and never made into a list, and the run sends nothing more while the results
    delivered and not yet read reach its concurrency, so a run of a million requests holds about
    ``concurrency`` requests and results at a time, whatever N (with a ``cache``, two lookup chunks of 512
    requests more; the progress bar counts up, its total unknown). The index is the request's position in
    the iterable. The generator is advanced on the shared loop's thread, between requests: it should not
    block. A sequence (a list) is run as `gather` runs it, its results queued for the reader however fast
    they come. A provider batch (``batch=``) reads the whole iterable first.

    Closing the iterator cancels the requests still in flight. A ``break`` alone leaves the closing to the
    garbage collector; wrap the call in ``contextlib.aclosing(...)`` to cancel at once.

    Raises:
        InvalidRequestError: An option is unknown (the closest valid one is named) or has a bad value.
        AsyncBackendsError: Without ``return_exceptions``, the first failure, after cancelling the rest.
        Exception: Whatever the ``requests`` generator raises, after cancelling the requests in flight.
    """
    run_options = _run_options(return_exceptions, options)
    streamed = not run_options.batch and not isinstance(requests, (Sequence, str, bytes))
    manager = get_loop_manager()
    here = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    same_loop = here is manager.loop
    gate: Gate | None = None

    def put(index: int, outcome: Outcome) -> None:
        if gate is not None:
            gate.delivered_one()
        if same_loop:
            queue.put_nowait((index, outcome))
        else:
            here.call_soon_threadsafe(queue.put_nowait, (index, outcome))

    observer = watch(backend, run_options)
    run: Run | BatchRun
    if streamed:
        run = Run(backend, iter(requests), run_options, put, observer)
        # Room for one result per worker unread: a reader keeping up never holds the run back.
        gate = run.gate = Gate(run.concurrency)
    else:
        run = _runner(run_options)(backend, _as_sequence(requests), run_options, put, observer)
    task = asyncio.ensure_future(manager.arun(run.run()))
    getter: asyncio.Future[tuple[int, Any]] | None = None
    try:
        while True:
            if queue.empty():
                if task.done():
                    # Items are queued before the run's completion is signalled, so an empty queue and a
                    # finished run mean every result was read, or the run failed: raise its error.
                    task.result()
                    return
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait([getter, task], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()  # an item put meanwhile stays in the queue, read on the next turn
                    continue
                item = getter.result()
            else:
                item = queue.get_nowait()
            if gate is not None:
                gate.took()
            yield item
    finally:
        # Cancelled while waiting (Ctrl-C on the CLI): the getter would otherwise stay pending on a loop that
        # does not sweep up tasks, and be reported as "Task was destroyed but it is pending!" when collected.
        if getter is not None and not getter.done():
            getter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
