"""The per-attempt clock: what `gather`'s per-attempt timeout measures, and the waits it leaves out.

A run times each attempt with an `AttemptClock` (read by the run's deadline sweeper). Waiting for a slot is
never timed, whether the slot is one of the run's workers or one the adapter itself queues on (a pooled
HTTP connection, an engine seat): an adapter takes such a slot with `held_slot`, and while every part of the
attempt that asked for a slot is still waiting and none holds one, the clock stands still. Once any part
holds a slot the clock runs, so a part that hangs while holding a connection still times out, even if
another part of the same attempt (an n-sample fan-out) waits behind it.
"""

from __future__ import annotations

import asyncio
import math
import time
from contextvars import ContextVar

from .errors import BackendTimeoutError

__all__ = ["AttemptClock", "attempt_timed_out", "held_slot", "waiting_for_slot"]

_current: ContextVar[AttemptClock | None] = ContextVar("asyncbackends_attempt_clock", default=None)


class AttemptClock:
    """One worker's attempt deadline (monotonic seconds), paused while the attempt only waits for slots.

    Entered (``with clock:``) around one attempt of ``timeout`` seconds; leaving it after the run's deadline
    sweeper cancelled the attempt raises `BackendTimeoutError` instead, whatever the adapter turned the
    cancellation into (an adapter may map it to its own error, or an engine abort may fail), and restores
    the task's cancellation count so the next attempt is timed again. A sync context manager, not a
    coroutine around the call: one object fewer per request in flight on the hot path.

    Args:
        timeout: Seconds allowed per attempt.
    """

    __slots__ = ("_remaining", "attempt", "deadline", "expired", "held", "task", "timeout", "waiting")

    def __init__(self, timeout: float = math.inf) -> None:
        self.timeout = timeout
        self.attempt = 0  # the attempt being timed, named in its timeout error
        self.deadline = math.inf
        self.expired = False
        self.task: asyncio.Task[None] | None = None
        self.waiting = 0
        self.held = 0
        self._remaining: float | None = None  # seconds left while paused; None while running

    def bind(self) -> None:
        """Make this the clock of the current task and the tasks it spawns from here.

        Set once per worker, not per attempt: between attempts the clock is not timing (its deadline is
        infinite), so what reads it (`held_slot`, `attempt_timed_out`) sees no timed attempt.
        """
        _current.set(self)

    def start(self, timeout: float) -> None:
        """Start timing an attempt of ``timeout`` seconds in the current task (and the tasks it spawns)."""
        self.timeout = timeout
        self.bind()
        self.__enter__()

    def stop(self) -> None:
        """Stop timing: the attempt ended."""
        self.deadline = math.inf
        self._remaining = None
        _current.set(None)

    def __enter__(self) -> None:
        self.waiting = self.held = 0
        self._remaining = None
        self.deadline = time.monotonic() + self.timeout

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> None:
        self.deadline = math.inf
        self._remaining = None
        if not self.expired:
            return
        self.expired = False
        task = asyncio.current_task()
        assert task is not None
        if exc is None:  # the adapter swallowed our cancellation and answered anyway
            task.uncancel()
            return
        if task.uncancel() > 0:
            raise asyncio.CancelledError from exc  # cancelled from outside as well: that wins
        cause = None if isinstance(exc, asyncio.CancelledError) else exc
        raise BackendTimeoutError(f"attempt {self.attempt} took longer than {self.timeout} s") from cause

    def _update(self) -> None:
        paused = self.waiting > 0 and self.held == 0
        if paused and self._remaining is None and self.deadline != math.inf:
            self._remaining = max(0.0, self.deadline - time.monotonic())
            self.deadline = math.inf
        elif not paused and self._remaining is not None:
            self.deadline = time.monotonic() + self._remaining
            self._remaining = None


def attempt_timed_out() -> bool:
    """Whether the attempt running in this task was cancelled by `gather`'s per-attempt timeout.

    Read where a ``CancelledError`` is caught: a timed-out attempt is the backend's slowness (a router cools
    the replica down for it), any other cancellation is the caller's.
    """
    clock = _current.get()
    return clock is not None and clock.expired


def _timed_clock() -> AttemptClock | None:
    """The clock of the timed attempt running in this task, or ``None`` outside one."""
    clock = _current.get()
    if clock is None or (clock.deadline == math.inf and clock._remaining is None):
        return None
    return clock


class waiting_for_slot:  # lower case: used like the function it was (`async with waiting_for_slot():`)
    """Mark the body as a wait for a slot (a seat, a rate-limit token): not timed by `gather`.

    While every part of the attempt that asked for a slot is still waiting and none holds one, the
    attempt's clock stands still. Outside a timed attempt this does nothing.

    A class rather than an ``@asynccontextmanager``: it is entered once per request on the hot path, where
    a generator-based context manager costs several times more.
    """

    __slots__ = ("_clock",)

    def __init__(self) -> None:
        self._clock: AttemptClock | None = None

    async def __aenter__(self) -> None:
        clock = self._clock = _timed_clock()
        if clock is not None:
            clock.waiting += 1
            clock._update()

    async def __aexit__(self, *exc_info: object) -> None:
        clock = self._clock
        if clock is not None:
            clock.waiting -= 1
            clock._update()


class held_slot:  # lower case: used like the function it was (`async with held_slot(semaphore):`)
    """Hold one of ``semaphore``'s slots for the body; the wait for it is not timed by `gather`.

    ``None`` means no limit: the body runs at once. Outside a timed attempt this is a plain
    ``async with semaphore``.

    A class rather than an ``@asynccontextmanager`` (one per HTTP exchange on the hot path): a free slot is
    taken without pausing the clock, since nothing is waited for.
    """

    __slots__ = ("_clock", "_semaphore")

    def __init__(self, semaphore: asyncio.Semaphore | None) -> None:
        self._semaphore = semaphore
        self._clock: AttemptClock | None = None

    async def __aenter__(self) -> None:
        semaphore = self._semaphore
        if semaphore is None:
            return
        clock = _timed_clock()
        if clock is None:
            await semaphore.acquire()
            return
        if semaphore.locked():  # a wait for the slot: the clock stands still meanwhile
            clock.waiting += 1
            clock._update()
            try:
                await semaphore.acquire()
            finally:
                clock.waiting -= 1
                clock._update()
        else:
            await semaphore.acquire()  # free: taken at once, nothing to pause
        clock.held += 1
        clock._update()
        self._clock = clock

    async def __aexit__(self, *exc_info: object) -> None:
        semaphore = self._semaphore
        if semaphore is None:
            return
        clock = self._clock
        if clock is not None:
            clock.held -= 1
            clock._update()
        semaphore.release()
