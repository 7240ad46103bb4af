"""Where a run's workers take their next request: a sequence by index, or a caller's iterator on demand.

A run reads its requests through one iterator of ``(index, request)`` pairs, shared by its workers; each
takes the next pair only when it is free, so a generator handed to `as_completed` is advanced one request
per freed slot (a cached run reads two lookup chunks ahead), never materialised. A streamed run knows no
total: its progress bar counts up, and ``RunMetrics.requests`` counts the requests as they are taken.

`Gate` is the other half of streaming: a count of what was handed on and not yet taken, which a run waits on
before taking its next request. A streamed `as_completed` gates the results its reader has not read yet
(``bound``: the concurrency), and the response cache the results its writer thread has not committed yet
(`_cache_writer`), so what a run of a million requests holds at once is bounded, not grown with N.
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
    """How many things (results) a run may have handed on that the other side has not taken yet.

    The run calls `delivered_one` as it hands one on and, before taking its next request, `full` (and
    `room` when full); the other side calls `took` for those it takes, from any thread. Waiting workers
    wake once it has taken them down to half the bound: one wake-up per half-bound, not per item.

    Args:
        bound: Most handed on and not taken before the run stops taking requests.
    """

    def __init__(self, bound: int) -> None:
        self.bound = max(1, bound)
        self.low = self.bound // 2
        self.delivered = 0  # written on the run's side only
        self.taken = 0  # written by the other side only, under the lock
        self._lock = threading.Lock()
        self._waiters: list[asyncio.Future[None]] = []

    def full(self) -> bool:
        """Whether ``bound`` wait untaken (one taken on another thread may show late: `room` rechecks)."""
        return self.delivered - self.taken >= self.bound

    def delivered_one(self) -> None:
        """One more handed on."""
        self.delivered += 1

    async def room(self) -> None:
        """Return once fewer than ``bound`` wait untaken."""
        with self._lock:
            if self.delivered - self.taken < self.bound:
                return
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
        # Each worker its own future: one cancelled worker must not cancel the others' wait.
        await waiter

    def took(self, count: int = 1) -> None:
        """The other side took ``count``; wake the waiting workers once down to half the bound."""
        with self._lock:
            self.taken += count
            if not self._waiters or self.delivered - self.taken > self.low:
                return
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):  # the run's loop closed: nothing waits any more
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)
