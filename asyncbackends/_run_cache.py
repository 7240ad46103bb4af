"""A run's side of the response cache: its cached part found by set lookups, the rest keyed once.

`misses` is the iterator a run's workers pull ``(index, request)`` pairs from when the run has a cache. It
reads the run's own pairs (`_run_feed`: a sequence, or a caller's generator) a chunk at a time: each
request's key is computed once (the backend's fingerprint hashed once per run), the chunk's keys are looked
up in one query (on the cache's reader thread, the next chunk's while this one is decoded), and a hit is
delivered on the spot (to the sink, metrics, observer and progress bar, as a worker would), so only misses
reach the workers, with their keys kept for storing their results. Nothing is held beyond two chunks: a
resumed run of a million requests streams its cached results to the caller without a second copy, and a
streamed one (`_run_feed.Gate`) pauses while its caller has ``bound`` results unread.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from itertools import islice
from typing import Any, NamedTuple, Protocol

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


__all__ = ["CHUNK", "looked_up", "looked_up_chunks", "misses", "settle"]

log = logging.getLogger(__name__)

CHUNK = 512  # requests looked up in one query: one round trip for many, and little held at a time


def misses(run: RunState, cache: ResponseCache) -> Iterator[Item]:
    """``run``'s pairs whose requests are not in ``cache``, in order; hits delivered on the way.

    A streamed run's caller with ``gate.bound`` results unread gets `PAUSE` between hits: the worker
    waits for room, as it does before taking a miss.
    """
    gate, metrics = run.gate, run.metrics
    for chunk, found in looked_up_chunks(cache, run.backend, run.source, metrics):
        keys = chunk.keys
        for index, request in chunk.pairs:
            key = keys.get(index)
            row = None if key is None else found.get(key)
            if row is not None and (result := _read(cache, row, request, metrics)) is not None:
                deliver_hit(run, index, request, result)
                if gate is not None and gate.full():
                    yield PAUSE
                continue
            if key is not None and index not in chunk.uncached:
                run.keys[index] = key
            yield index, request


def looked_up(
    cache: ResponseCache, backend: AsyncBackend, requests: Sequence[Request], metrics: RunMetrics | None
) -> Iterator[tuple[int, str | None, Result | None]]:
    """Each request's index, key (``None``: not a request) and stored result (``None``: a miss), in order.

    For a provider batch's run (which names each request by its key, cacheable or not).
    """
    for chunk, found in looked_up_chunks(cache, backend, enumerate(requests), metrics):
        for index, request in chunk.pairs:
            key = chunk.keys.get(index)
            row = None if key is None else found.get(key)
            yield index, key, None if row is None else _read(cache, row, request, metrics)


def looked_up_chunks(
    cache: ResponseCache,
    backend: AsyncBackend,
    pairs: Iterable[tuple[int, Request]],
    metrics: RunMetrics | None,
) -> Iterator[tuple[_Chunk, dict[str, tuple[str, str]]]]:
    """``pairs`` a chunk at a time, each with its keys and the stored ``(kind, value)`` found for them.

    One query per chunk of keys; an unreadable database is a miss for the whole chunk, counted in
    ``read_failures`` (and the metrics) and warned once per cause. On a file that holds results, each
    chunk is looked up on the cache's reader thread (`ResponseCache.lookup`) while the chunk before it is
    decoded and handed on: SQLite's part runs beside the decoding, so two chunks are read ahead of what is
    handed on.
    """
    keyer = Keyer(backend)
    # Started on an empty file, a run finds nothing in it but what it stores itself: only the results
    # still queued are looked at (a request repeated after its first answer was committed is sent again).
    try:
        fresh = cache.empty()
    except sqlite3.Error:
        fresh = False  # an unreadable file: each chunk's lookup fails, counted and warned below
    pairs = iter(pairs)
    ahead: _Chunk | None = None
    while True:
        chunk: list[tuple[int, Request]] = []
        error: Exception | None = None
        try:
            chunk.extend(islice(pairs, CHUNK))  # what the source gave stays in `chunk` if it then raises
        except Exception as exc:
            error = exc  # raised once every request the source gave before it is handled, as without a cache
        current: _Chunk | None = None
        if chunk:
            keys: dict[int, str] = {}
            wanted: list[str] = []
            uncached: set[int] = set()
            for index, request in chunk:
                try:
                    keys[index] = key = keyer(request)
                except Exception:  # not a request: the worker refuses it with its own error
                    continue
                if cache.cacheable(request):
                    wanted.append(key)
                else:
                    uncached.add(index)
            # On an empty file only the queued results are looked at: nothing to wait for or read ahead.
            current = _Chunk(chunk, keys, wanted, uncached, None if fresh else cache.lookup(wanted))
        if ahead is not None:
            yield ahead, _found(cache, ahead, metrics)
            ahead = None
        if current is not None and (fresh or error is not None):
            yield current, _found(cache, current, metrics)
            current = None
        if error is not None:
            raise error
        if not chunk:
            return
        ahead = current


class _Chunk(NamedTuple):
    pairs: list[tuple[int, Request]]
    keys: dict[int, str]  # index -> key, for each request that has one
    wanted: list[str]  # the keys of the cacheable requests
    uncached: set[int]  # the indexes of those that are not (unseeded sampling): never stored
    found: Future[dict[str, tuple[str, str]]] | None  # their lookup on the reader thread; None: queued only


def _found(cache: ResponseCache, chunk: _Chunk, metrics: RunMetrics | None) -> dict[str, tuple[str, str]]:
    """``chunk``'s stored rows by key, once its lookup has ended; none if the database can't be read."""
    try:
        return chunk.found.result() if chunk.found else cache.stored(chunk.wanted, queued_only=True)
    except sqlite3.Error as exc:
        # An unreadable database: every request of the chunk is sent (and counted as a failed read).
        for _ in chunk.wanted:
            cache.read_failed(exc)
            if metrics is not None:
                metrics.cache_read_failures += 1
        return {}


def _read(
    cache: ResponseCache, row: tuple[str, str], request: Request, metrics: RunMetrics | None
) -> Result | None:
    """A stored row as ``request``'s result; ``None`` (counted in the metrics too) if unreadable."""
    result = cache.read(row[0], row[1], request.request_id)
    if result is None and metrics is not None:
        metrics.cache_read_failures += 1
    return result


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
