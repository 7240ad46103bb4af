"""Where a run's workers take their next request: a sequence by index, or a caller's iterator on demand.

A run reads its requests through one iterator of ``(index, request)`` pairs, shared by its workers; each
takes the next pair only when it is free, so a generator handed to `as_completed` is advanced one request
per freed slot (a cached run reads one lookup chunk ahead), never materialised. A streamed run knows no
total: its progress bar counts up, and ``RunMetrics.requests`` counts the requests as they are taken.

`Gate` is the other half of streaming: results delivered to a caller who has not read them yet. A streamed
`as_completed` lets the run take no further request while ``bound`` results wait unread, so what a run of a
million requests holds at once is bounded by its concurrency, not by N.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Iterator

from ._observability.run_metrics import RunMetrics
from ._types import Request

__all__ = ["PAUSE", "Gate", "Item", "counted"]

Item = tuple[int, Request | None]  # an index and its request; `PAUSE` (no request) asks to wait for room
PAUSE: Item = (-1, None)


def counted(requests: Iterable[Request], metrics: RunMetrics | None) -> Iterator[tuple[int, Request]]:
    """A caller's requests with their positions, each counted in ``metrics`` as it is taken."""
    if metrics is None:
        yield from enumerate(requests)
        return
    for pair in enumerate(requests):
        metrics.requests += 1
        yield pair


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Gate:
    """How many results a streamed run may have delivered that its caller has not read yet.

    The run calls `delivered_one` as it delivers a result and, before taking its next request, `full`
    (and `room` when full); the caller calls `read_one` for each result it reads, from any thread. Waiting
    workers wake once the caller has read down to half the bound, one wake-up per half-bound, not per read.

    Args:
        bound: Most results delivered and unread before the run stops taking requests.
    """

    def __init__(self, bound: int) -> None:
        self.bound = max(1, bound)
        self.low = self.bound // 2
        self.delivered = 0  # written on the run's loop only
        self.read = 0  # written by the caller only, under the lock
        self._lock = threading.Lock()
        self._waiters: list[asyncio.Future[None]] = []

    def full(self) -> bool:
        """Whether ``bound`` results wait unread (a read on another thread may show late: `room` rechecks)."""
        return self.delivered - self.read >= self.bound

    def delivered_one(self) -> None:
        """One more result handed to the caller."""
        self.delivered += 1

    async def room(self) -> None:
        """Return once fewer than ``bound`` results wait unread."""
        with self._lock:
            if self.delivered - self.read < self.bound:
                return
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
        # Each worker its own future: one cancelled worker must not cancel the others' wait.
        await waiter

    def read_one(self) -> None:
        """The caller read one result; wake the waiting workers once half the bound is read."""
        with self._lock:
            self.read += 1
            if not self._waiters or self.delivered - self.read > self.low:
                return
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):  # the run's loop closed: nothing waits any more
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)
