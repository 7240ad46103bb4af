"""`RunCallbacks`: plain functions a run calls as requests finish, retry and use tokens.

For code without OpenTelemetry: an eval framework logs to its own tracker, a notebook updates a chart::

    def log(done: ab.RequestDone) -> None:
        tracker.log({"latency_s": done.latency_s, "error": done.error_type})

    ab.run_batch(backend, requests, callbacks=ab.RunCallbacks(on_request_done=log))

Every callback is called on the shared loop's thread, in the order things happen: keep it quick (hand heavy
work to a queue). An exception raised by a callback is logged once per run and otherwise ignored, so a
broken logger never fails an evaluation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .._types import GenerationResult, Request
from ..errors import AsyncBackendsError, BackendError, RateLimitedError
from .observe import Outcome, RequestObserver, RunObserver
from .run_metrics import thinking_of

__all__ = ["CallbackObserver", "RequestDone", "RetryEvent", "RunCallbacks", "TokenUsage"]

log = logging.getLogger(__name__)

Event = TypeVar("Event")


@dataclass(frozen=True, slots=True)
class RequestDone:
    """One request's end, as `RunCallbacks.on_request_done` receives it.

    Attributes:
        index: The request's position in the run's input.
        request_id: The request's id, if it had one.
        outcome: The result, or the error the caller gets.
        error_type: The error's class name (``"RateLimitedError"``), ``None`` on success.
        latency_s: Seconds from a worker taking the request to its end (attempts, retry delays, rate waits).
        slot_wait_s: Seconds the request waited in the run's queue for a free worker before that.
        rate_wait_s: Seconds the run's rate limiter held its attempts back (inside ``latency_s``).
        attempts: Attempts made (0 for a cache hit).
        cached: The result came from the response cache.
        replica: The replica that served the last attempt, where the backend is a pool.
        finished_at: ``time.time()`` when it ended.
    """

    index: int
    request_id: str | None
    outcome: object
    error_type: str | None
    latency_s: float
    slot_wait_s: float
    rate_wait_s: float
    attempts: int
    cached: bool
    replica: str | None
    finished_at: float


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """A failed attempt that will be retried, as `RunCallbacks.on_retry` receives it.

    Attributes:
        index: The request's position in the run's input.
        request_id: The request's id, if it had one.
        attempt: The attempt that failed (1 for the first).
        error: The error it failed with.
        reason: The error's class name: what the retry is counted under.
        delay_s: Seconds before the next attempt.
        retry_after_s: The server's ``Retry-After``, where it sent one.
        replica: The replica that failed, where the backend is a pool.
    """

    index: int
    request_id: str | None
    attempt: int
    error: BackendError
    reason: str
    delay_s: float
    retry_after_s: float | None
    replica: str | None


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Tokens one generation request used, as `RunCallbacks.on_usage` receives it.

    Attributes:
        index: The request's position in the run's input.
        request_id: The request's id, if it had one.
        input_tokens: Prompt tokens, where the backend reported them.
        output_tokens: Generated tokens over all completions.
        cached: Read from the response cache (no tokens were spent on it in this run).
        reasoning_tokens: Of ``output_tokens``, those a reasoning model spent thinking.
    """

    index: int
    request_id: str | None
    input_tokens: int | None
    output_tokens: int
    cached: bool
    reasoning_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RunCallbacks:
    """Functions a run calls as it goes; pass as ``gather(..., callbacks=ab.RunCallbacks(...))``.

    Args:
        on_request_done: Called with a `RequestDone` as each request ends, successful or not.
        on_retry: Called with a `RetryEvent` before each retry's delay.
        on_usage: Called with a `TokenUsage` for each successful generation request.
    """

    on_request_done: Callable[[RequestDone], object] | None = None
    on_retry: Callable[[RetryEvent], object] | None = None
    on_usage: Callable[[TokenUsage], object] | None = None

    def __post_init__(self) -> None:
        from ..errors import InvalidRequestError

        for name in ("on_request_done", "on_retry", "on_usage"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise InvalidRequestError(f"RunCallbacks.{name} must be callable, got {type(value).__name__}")


class _CallbackRequest(RequestObserver):
    __slots__ = (
        "attempts",
        "cached",
        "index",
        "rate_wait",
        "replica_name",
        "request",
        "run",
        "slot_wait",
        "t0",
    )

    def __init__(self, run: CallbackObserver, index: int, request: Request, slot_wait: float) -> None:
        self.run, self.index, self.request, self.slot_wait = run, index, request, slot_wait
        self.t0 = time.perf_counter()
        self.attempts = 0
        self.rate_wait = 0.0
        self.cached = False
        self.replica_name: str | None = None

    def cache_hit(self) -> None:
        self.cached = True

    def rate_waited(self, seconds: float) -> None:
        self.rate_wait += seconds

    def attempt_started(self, attempt: int) -> None:
        self.attempts = attempt

    def replica(self, name: str) -> None:
        self.replica_name = name

    def retrying(self, attempt: int, error: BackendError, delay: float) -> None:
        on_retry = self.run.callbacks.on_retry
        if on_retry is not None:
            retry_after = error.retry_after if isinstance(error, RateLimitedError) else None
            event = RetryEvent(
                self.index,
                self.request.request_id,
                attempt,
                error,
                type(error).__name__,
                delay,
                retry_after,
                self.replica_name,
            )
            self.run.call(on_retry, event)

    def done(self, outcome: Outcome) -> None:
        callbacks = self.run.callbacks
        failed = isinstance(outcome, AsyncBackendsError)
        if callbacks.on_request_done is not None:
            event = RequestDone(
                self.index,
                self.request.request_id,
                outcome,
                type(outcome).__name__ if failed else None,
                time.perf_counter() - self.t0,
                self.slot_wait,
                self.rate_wait,
                self.attempts,
                self.cached,
                self.replica_name,
                time.time(),
            )
            self.run.call(callbacks.on_request_done, event)
        if callbacks.on_usage is not None and isinstance(outcome, GenerationResult):
            usage = TokenUsage(
                self.index,
                self.request.request_id,
                outcome.prompt_tokens,
                outcome.completion_tokens,
                self.cached,
                thinking_of(outcome)[0],
            )
            self.run.call(callbacks.on_usage, usage)


class CallbackObserver(RunObserver):
    """The run observer that calls a `RunCallbacks`' functions."""

    __slots__ = ("callbacks", "failed_once")

    def __init__(self, backend: object, callbacks: RunCallbacks) -> None:
        self.callbacks = callbacks
        self.failed_once = False

    def request_started(self, index: int, request: Request, slot_wait: float) -> RequestObserver:
        """Start timing the request."""
        return _CallbackRequest(self, index, request, slot_wait)

    def call(self, function: Callable[[Event], object], event: Event) -> None:
        """Call one callback; its failure is logged (once per run) and otherwise ignored."""
        try:
            function(event)
        except Exception:
            if not self.failed_once:
                self.failed_once = True
                log.exception("a RunCallbacks callback raised (logged once per run; the run goes on)")
