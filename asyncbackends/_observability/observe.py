"""The run's observer interface: the few points where a run tells watchers what happens.

A run asks `run_observer` once, when it starts, for its observer: ``None`` when nothing watches (no
`RunCallbacks` given, no OpenTelemetry SDK configured), so the hot path pays one ``is None`` check per
request and nothing else. Otherwise, for each request the worker picks up, the run calls
`RunObserver.request_started` and then the returned `RequestObserver`'s hooks, in this order::

    request_started(index, request, slot_wait)        # a worker took the request (slot_wait: s in queue)
      cache_hit()                                     # found in the cache: done() follows
      rate_waited(seconds)                            # the run's rate limiter held the attempt back
      attempt_started(attempt)                        # 1, 2, ... (every hook in the worker's task)
      attempt_ended(attempt, error or None)
      retrying(attempt, error, delay)                 # the attempt failed, another follows after delay
      done(outcome)                                   # the result or the error the caller gets
      cancelled()                                     # instead of done(): cancelled with the run

Two implementations ship: OpenTelemetry spans and metrics (`telemetry`) and plain
callbacks (`callbacks.RunCallbacks`); with both, `Fanout` calls each in turn; `observers.watch` builds a
run's (this module knows none of them). A wrapper backend that sends an attempt to one of several replicas
(a pool) calls `note_replica` inside the attempt, so the observers can say which replica served it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar

from .._types import Request, Result
from ..errors import AsyncBackendsError, BackendError

__all__ = [
    "Fanout",
    "RequestObserver",
    "RunObserver",
    "note_replica",
]

Outcome = Result | AsyncBackendsError

# The observer of the attempt running in this task (set by the run only while something observes).
current_request: ContextVar[RequestObserver | None] = ContextVar("asyncbackends_observed", default=None)


class RequestObserver:
    """Watches one request; every hook does nothing here. Hooks must be quick and must not raise."""

    __slots__ = ()

    def cache_hit(self) -> None:
        """The result came from the response cache; `done` follows."""

    def rate_waited(self, seconds: float) -> None:
        """The run's rate limiter held the next attempt back this long."""

    def attempt_started(self, attempt: int) -> None:
        """Attempt number ``attempt`` (1 for the first) is about to call the backend."""

    def attempt_ended(self, attempt: int, error: BaseException | None) -> None:
        """The attempt returned (``error`` None) or failed."""

    def replica(self, name: str) -> None:
        """A pool sent the current attempt to replica ``name``."""

    def retrying(self, attempt: int, error: BackendError, delay: float) -> None:
        """Attempt ``attempt`` failed with a retryable ``error``; the next starts after ``delay`` s."""

    def done(self, outcome: Outcome) -> None:
        """The request ended with this result or error (the one the caller gets)."""

    def cancelled(self) -> None:
        """The request was cancelled with its run (the caller cancelled, or another request failed)."""


class RunObserver:
    """Watches one run; `request_started` hands out each request's `RequestObserver`."""

    __slots__ = ()

    def request_started(self, index: int, request: Request, slot_wait: float) -> RequestObserver:
        """A worker took request ``index`` after ``slot_wait`` seconds in the run's queue."""
        return RequestObserver()

    def run_ended(self) -> None:
        """The run ended (every request done, or the run failed or was cancelled)."""


class _FanoutRequest(RequestObserver):
    __slots__ = ("_parts",)

    def __init__(self, parts: Sequence[RequestObserver]) -> None:
        self._parts = parts

    def cache_hit(self) -> None:
        for part in self._parts:
            part.cache_hit()

    def rate_waited(self, seconds: float) -> None:
        for part in self._parts:
            part.rate_waited(seconds)

    def attempt_started(self, attempt: int) -> None:
        for part in self._parts:
            part.attempt_started(attempt)

    def attempt_ended(self, attempt: int, error: BaseException | None) -> None:
        for part in self._parts:
            part.attempt_ended(attempt, error)

    def replica(self, name: str) -> None:
        for part in self._parts:
            part.replica(name)

    def retrying(self, attempt: int, error: BackendError, delay: float) -> None:
        for part in self._parts:
            part.retrying(attempt, error, delay)

    def done(self, outcome: Outcome) -> None:
        for part in self._parts:
            part.done(outcome)

    def cancelled(self) -> None:
        for part in self._parts:
            part.cancelled()


class Fanout(RunObserver):
    """Several observers as one, called in the order given."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[RunObserver]) -> None:
        self.parts = tuple(parts)

    def request_started(self, index: int, request: Request, slot_wait: float) -> RequestObserver:
        """Start the request in every part."""
        return _FanoutRequest([p.request_started(index, request, slot_wait) for p in self.parts])

    def run_ended(self) -> None:
        """End the run in every part."""
        for part in self.parts:
            part.run_ended()


def note_replica(name: str) -> None:
    """Say which replica serves the attempt running in this task (a pool calls this; cheap when unwatched)."""
    observer = current_request.get()
    if observer is not None:
        observer.replica(name)
