"""A run's side of the response cache: its cached part found by set lookups, the rest keyed once.

`misses` is the iterator a run's workers pull request indices from when the run has a cache. It reads
the requests a chunk at a time: each request's key is computed once (the backend's fingerprint hashed once
per run), the chunk's keys are looked up in one query, and a hit is delivered on the spot (to the sink,
metrics, observer and progress bar, as a worker would), so only misses reach the workers, with their keys
kept for storing their results. Nothing is held beyond one chunk: a resumed run of a million requests
streams its cached results into the caller's list without a second copy.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ._cache import ResponseCache
from ._cache_codec import Keyer
from ._types import Request, Result

if TYPE_CHECKING:
    from ._run import Run

__all__ = ["CHUNK", "misses", "settle"]

log = logging.getLogger(__name__)

CHUNK = 512  # requests looked up in one query: one round trip for many, and little held at a time


def misses(run: Run, cache: ResponseCache) -> Iterator[int]:
    """The indices of ``run``'s requests not in ``cache``, in order; hits delivered on the way."""
    requests = run.requests
    keyer = Keyer(run.backend)
    # Started on an empty file, a run finds nothing in it but what it stores itself: only the results
    # still queued are looked at (a request repeated after its first answer was committed is sent again).
    try:
        fresh = cache.empty()
    except sqlite3.Error:
        fresh = False  # an unreadable file: each chunk's lookup fails, counted and warned below
    for start in range(0, len(requests), CHUNK):
        keys: dict[int, str] = {}
        for index in range(start, min(start + CHUNK, len(requests))):
            request = requests[index]
            try:
                if cache.cacheable(request):
                    keys[index] = keyer(request)
            except Exception:  # not a request: the worker refuses it with its own error
                continue
        try:
            found = cache.stored(list(keys.values()), queued_only=fresh)
        except sqlite3.Error as exc:
            # An unreadable database: every request of the chunk is sent (and counted as a failed read).
            found = {}
            for _ in keys:
                cache.read_failed(exc)
                if run.metrics is not None:
                    run.metrics.cache_read_failures += 1
        for index in range(start, min(start + CHUNK, len(requests))):
            key = keys.get(index)
            row = None if key is None else found.get(key)
            if row is not None:
                result = cache.read(row[0], row[1], requests[index].request_id)
                if result is not None:
                    deliver_hit(run, index, requests[index], result)
                    continue
                if run.metrics is not None:
                    run.metrics.cache_read_failures += 1
            if key is not None:
                run.keys[index] = key
            yield index


def deliver_hit(run: Run, index: int, request: Request, result: Result) -> None:
    """A cached result to the run's sink, metrics, observer and progress bar, as a worker delivers one."""
    metrics = run.metrics
    if metrics is not None:
        metrics.cache_hits += 1
        metrics._record_outcome(result)
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
