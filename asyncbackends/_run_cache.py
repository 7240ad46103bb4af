"""A run's side of the response cache: its cached part found by set lookups, the rest keyed once.

`misses` is the iterator a run's workers pull ``(index, request)`` pairs from when the run has a cache. It
reads the run's own pairs (`_run_feed`: a sequence, or a caller's generator) a chunk at a time: each
request's key is computed once (the backend's fingerprint hashed once per run), the chunk's keys are looked
up in one query, and a hit is delivered on the spot (to the sink, metrics, observer and progress bar, as a
worker would), so only misses reach the workers, with their keys kept for storing their results. Nothing is
held beyond one chunk: a resumed run of a million requests streams its cached results to the caller without
a second copy, and a streamed one (`_run_feed.Gate`) pauses while its caller has ``bound`` results unread.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, Protocol

from ._cache import ResponseCache
from ._cache_codec import Keyer
from ._observability.observe import RunObserver
from ._observability.run_metrics import RunMetrics
from ._protocol import AsyncBackend
from ._run_feed import PAUSE, Gate, Item
from ._types import Request, Result
from ._usage import Pricing


class RunState(Protocol):
    """What of a run (`asyncbackends._run.Run`) its cache side reads and fills: named here, not imported."""

    backend: AsyncBackend
    source: Iterator[tuple[int, Request]]
    gate: Gate | None
    metrics: RunMetrics | None
    observer: RunObserver | None
    pricing: Pricing | None
    keys: dict[int, str]
    started: float
    bar: Any

    @property
    def sink(
        self,
    ) -> Callable[[int, Any], None]: ...  # a read-only member: the run's own is a plain attribute


__all__ = ["CHUNK", "looked_up", "looked_up_pairs", "misses", "settle"]

log = logging.getLogger(__name__)

CHUNK = 512  # requests looked up in one query: one round trip for many, and little held at a time


def misses(run: RunState, cache: ResponseCache) -> Iterator[Item]:
    """``run``'s pairs whose requests are not in ``cache``, in order; hits delivered on the way.

    A streamed run's caller with ``gate.bound`` results unread gets `PAUSE` between hits: the worker
    waits for room, as it does before taking a miss.
    """
    gate = run.gate
    for index, request, key, result in looked_up_pairs(cache, run.backend, run.source, run.metrics):
        if result is not None:
            deliver_hit(run, index, request, result)
            if gate is not None and gate.full():
                yield PAUSE
            continue
        if key is not None and cache.cacheable(request):
            run.keys[index] = key
        yield index, request


def looked_up(
    cache: ResponseCache, backend: AsyncBackend, requests: Sequence[Request], metrics: RunMetrics | None
) -> Iterator[tuple[int, str | None, Result | None]]:
    """Each request's index, key (``None``: not a request) and stored result (``None``: a miss), in order.

    `looked_up_pairs` over a sequence, for a provider batch's run.
    """
    for index, _, key, result in looked_up_pairs(cache, backend, enumerate(requests), metrics):
        yield index, key, result


def looked_up_pairs(
    cache: ResponseCache,
    backend: AsyncBackend,
    pairs: Iterable[tuple[int, Request]],
    metrics: RunMetrics | None,
) -> Iterator[tuple[int, Request, str | None, Result | None]]:
    """Each pair's index, request, key (``None``: not a request) and stored result (``None``: a miss).

    Reads ``pairs`` a chunk at a time, one query per chunk of keys; an unreadable entry or database is a
    miss, counted in ``read_failures`` (and the metrics) and warned once per cause.
    """
    keyer = Keyer(backend)
    # Started on an empty file, a run finds nothing in it but what it stores itself: only the results
    # still queued are looked at (a request repeated after its first answer was committed is sent again).
    try:
        fresh = cache.empty()
    except sqlite3.Error:
        fresh = False  # an unreadable file: each chunk's lookup fails, counted and warned below
    pairs = iter(pairs)
    while chunk := list(islice(pairs, CHUNK)):
        keys: dict[int, str] = {}
        wanted: list[str] = []
        for index, request in chunk:
            try:
                keys[index] = key = keyer(request)
            except Exception:  # not a request: the worker refuses it with its own error
                continue
            if cache.cacheable(request):
                wanted.append(key)
        try:
            found = cache.stored(wanted, queued_only=fresh)
        except sqlite3.Error as exc:
            # An unreadable database: every request of the chunk is sent (and counted as a failed read).
            found = {}
            for _ in wanted:
                cache.read_failed(exc)
                if metrics is not None:
                    metrics.cache_read_failures += 1
        for index, request in chunk:
            known = keys.get(index)
            row = None if known is None else found.get(known)
            result = None if row is None else cache.read(row[0], row[1], request.request_id)
            if row is not None and result is None and metrics is not None:
                metrics.cache_read_failures += 1
            yield index, request, known, result


def deliver_hit(run: RunState, index: int, request: Request, result: Result) -> None:
    """A cached result to the run's sink, metrics, observer and progress bar, as a worker delivers one."""
    metrics = run.metrics
    if metrics is not None:
        metrics.cache_hits += 1
        metrics._record_outcome(result, run.pricing)  # a cached result counts at its usage, as sent ones do
    if run.observer is not None:
        watched = run.observer.request_started(index, request, 0.0)
        watched.cache_hit()
        watched.done(result)
    run.sink(index, result)
    if metrics is not None:
        metrics._record_latency(0.0, time.perf_counter() - (metrics.started or run.started))
        if metrics.on_update is not None:
            metrics.on_update(metrics)
    if run.bar is not None:
        run.bar.update(1)


async def settle(cache: ResponseCache, *, close: bool) -> None:
    """Wait, off the loop, until ``cache`` committed what the run queued; close it if the run opened it."""
    finish = cache.close if close else cache.flush
    try:
        await asyncio.to_thread(finish)
    except asyncio.CancelledError:
        # Cancelled again while waiting: finish here rather than leave a file open or results queued.
        finish()
        raise
