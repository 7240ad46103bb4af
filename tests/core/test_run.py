"""The run's per-attempt timing at its edges: tests that fail when a branch of `_run.Run.attempt` goes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._cache import CacheReadWarning
from asyncbackends._clock import AttemptClock
from asyncbackends._observability.observe import RequestObserver, RunObserver, note_replica
from asyncbackends._options import RunOptions
from asyncbackends._run import Run


def requests(n: int) -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"p{i}", request_id=f"p{i}") for i in range(n)]


class Waits(ab.BaseBackend):
    name = "waits"

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.entered.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_a_caller_cancellation_arriving_with_the_deadline_wins_over_the_timeout() -> None:
    # The sweeper and the caller cancel the same attempt before it runs again: the caller's cancellation
    # must come out as CancelledError, not be turned into a (retryable) BackendTimeoutError.
    async def main() -> None:
        backend = Waits()
        run = Run(backend, requests(1), RunOptions(timeout=10), lambda i, o: None)
        slot = AttemptClock()
        attempt = asyncio.ensure_future(run.attempt(backend.generate, requests(1)[0], slot, 1))
        await backend.entered.wait()
        slot.expired = True  # what the sweeper does on the deadline ...
        attempt.cancel()
        attempt.cancel()  # ... and the caller's own cancellation, in the same loop iteration
        with pytest.raises(asyncio.CancelledError):
            await attempt

        alone = Waits()
        slot = AttemptClock()
        attempt = asyncio.ensure_future(run.attempt(alone.generate, requests(1)[0], slot, 1))
        await alone.entered.wait()
        slot.expired = True  # the deadline alone: a timeout
        attempt.cancel()
        with pytest.raises(ab.BackendTimeoutError):
            await attempt

    asyncio.run(main())


class SwallowsFirstCancel(ab.BaseBackend):
    """Answers its first request even when cancelled; its later requests hang."""

    name = "swallows"

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.calls += 1
        if self.calls == 1:
            with contextlib.suppress(asyncio.CancelledError):  # swallowed: the adapter answers anyway
                await asyncio.sleep(3600)
            return ab.GenerationResult(request.request_id, (ab.Completion("late"),))
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_after_an_adapter_swallows_the_timeout_the_next_attempt_is_timed_again() -> None:
    backend = SwallowsFirstCancel()
    start = time.perf_counter()
    outcomes = ab.run_batch(
        backend,
        requests(2),
        concurrency=1,  # one worker: the second request runs on the clock and task of the first
        timeout=0.2,
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], ab.GenerationResult) and outcomes[0].text == "late"
    assert isinstance(outcomes[1], ab.BackendTimeoutError)  # timed again, and a timeout, not a cancel
    assert time.perf_counter() - start < 30


def test_retry_after_is_capped_at_exactly_max_delay() -> None:
    policy = ab.RetryPolicy(initial_delay=0, max_delay=0.05, jitter=False)
    assert policy.delay(1, ab.RateLimitedError("slow down", retry_after=1000)) == 0.05
    assert policy.delay(1, ab.RateLimitedError("slow down", retry_after=0.01)) == 0.01
    jittered = ab.RetryPolicy(initial_delay=1, max_delay=2)
    assert jittered.delay(5, ab.RateLimitedError("x", retry_after=1000)) == 2
    assert ab.RetryPolicy(initial_delay=1, max_delay=8, jitter=False).delay(3, ab.BackendError("x")) == 4


# The observer hooks, in the order asyncbackends._observability.observe documents (found by mutation testing).


class Recording(RunObserver):
    """Records every hook a run calls, as (index, hook, argument) tuples."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.ended = 0

    def request_started(self, index: int, request: Any, slot_wait: float) -> RequestObserver:
        self.events.append((index, "started", request.request_id, slot_wait))
        events = self.events

        class Request(RequestObserver):
            def cache_hit(self) -> None:
                events.append((index, "cache_hit"))

            def rate_waited(self, seconds: float) -> None:
                events.append((index, "rate_waited", seconds))

            def attempt_started(self, attempt: int) -> None:
                events.append((index, "attempt_started", attempt))

            def attempt_ended(self, attempt: int, error: BaseException | None) -> None:
                events.append((index, "attempt_ended", attempt, type(error).__name__ if error else None))

            def replica(self, name: str) -> None:
                events.append((index, "replica", name))

            def retrying(self, attempt: int, error: ab.BackendError, delay: float) -> None:
                events.append((index, "retrying", attempt, type(error).__name__, delay))

            def done(self, outcome: Any) -> None:
                events.append((index, "done", type(outcome).__name__))

            def cancelled(self) -> None:
                events.append((index, "cancelled"))

        return Request()

    def run_ended(self) -> None:
        self.ended += 1

    def of(self, index: int) -> list[tuple[Any, ...]]:
        return [event[1:] for event in self.events if event[0] == index and event[1] != "started"]


class Replicas(ab.BaseBackend):
    """Names a replica for each attempt; "again" fails its first attempt (retryable), "bad" is refused."""

    name = "replicas"

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}
        self.hang = asyncio.Event()

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        prompt = str(request.prompt)
        self.attempts[prompt] = self.attempts.get(prompt, 0) + 1
        note_replica(f"r{self.attempts[prompt]}")
        if prompt == "again" and self.attempts[prompt] == 1:
            raise ab.BackendUnavailableError("try again")
        if prompt == "bad":
            raise ab.InvalidRequestError("refused")
        if prompt == "hang":
            self.hang.set()
            await asyncio.sleep(3600)
        if prompt == "fail":
            await self.hang.wait()
            raise ab.RequestRejectedError("no")
        return ab.GenerationResult(request.request_id, (ab.Completion(prompt),))


def observed(backend: Any, prompts: list[str], observer: Recording, **options: Any) -> list[Any]:
    batch = [ab.GenerationRequest(p, request_id=p) for p in prompts]
    outcomes: list[Any] = [None] * len(batch)

    def sink(index: int, outcome: Any) -> None:
        outcomes[index] = outcome

    run = Run(backend, batch, RunOptions(**options), sink, observer)
    ab.get_loop_manager().run(run.run())
    return outcomes


def test_the_observer_sees_each_attempt_retry_replica_and_outcome() -> None:
    observer = Recording()
    retry = ab.RetryPolicy(max_attempts=3, initial_delay=0, jitter=False)
    outcomes = observed(
        Replicas(),
        ["ok", "again", "bad"],
        observer,
        concurrency=1,
        retry=retry,
        return_exceptions=True,
        timeout=60,  # timed attempts, observed: the attempt's clock is the worker's
    )
    assert [type(o).__name__ for o in outcomes] == [
        "GenerationResult",
        "GenerationResult",
        "InvalidRequestError",
    ]
    started = [event for event in observer.events if event[1] == "started"]
    assert [event[2] for event in started] == ["ok", "again", "bad"]
    assert all(0 <= event[3] < 60 for event in started)  # seconds since the run started, never negative
    assert observer.of(0) == [
        ("attempt_started", 1),
        ("replica", "r1"),
        ("attempt_ended", 1, None),
        ("done", "GenerationResult"),
    ]
    assert observer.of(1) == [
        ("attempt_started", 1),
        ("replica", "r1"),
        ("attempt_ended", 1, "BackendUnavailableError"),
        ("retrying", 1, "BackendUnavailableError", 0.0),
        ("attempt_started", 2),
        ("replica", "r2"),
        ("attempt_ended", 2, None),
        ("done", "GenerationResult"),
    ]
    assert observer.of(2) == [
        ("attempt_started", 1),
        ("replica", "r1"),
        ("attempt_ended", 1, "InvalidRequestError"),
        ("done", "InvalidRequestError"),
    ]
    assert observer.ended == 1


def test_the_observer_sees_cache_hits_rate_waits_and_cancellations(tmp_path: Path) -> None:
    cache = tmp_path / "c.sqlite"
    observed(Replicas(), ["ok"], Recording(), cache=cache)
    observer = Recording()
    rate = ab.RateLimit(requests_per_second=100)
    observed(Replicas(), ["ok", "new"], observer, cache=cache, rate_limit=rate, concurrency=1)
    assert observer.of(0) == [("cache_hit",), ("done", "GenerationResult")]
    waited = observer.of(1)[0]
    assert waited[0] == "rate_waited" and 0 <= waited[1] < 60
    assert observer.of(1)[1:] == [
        ("attempt_started", 1),
        ("replica", "r1"),
        ("attempt_ended", 1, None),
        ("done", "GenerationResult"),
    ]

    observer = Recording()
    with pytest.raises(ab.RequestRejectedError):
        observed(Replicas(), ["hang", "fail"], observer, concurrency=2)
    assert observer.of(0)[-2:] == [("attempt_ended", 1, "CancelledError"), ("cancelled",)]
    assert observer.of(1)[-1] == ("done", "RequestRejectedError")
    assert observer.ended == 1


# The run's own bookkeeping at its edges (found by mutation testing).


class Bare(ab.BaseBackend):
    """Fails with errors that name neither the request nor the backend, as a careless adapter would."""

    name = "bare"

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        raise ab.RequestRejectedError("no")


def test_an_adapters_error_is_labelled_with_its_request_and_backend() -> None:
    (outcome,) = ab.run_batch(Bare(), requests(1), return_exceptions=True)
    assert isinstance(outcome, ab.RequestRejectedError)
    assert (outcome.request_id, outcome.backend) == ("p0", "bare")


def test_a_timeout_says_which_attempt_and_hides_the_cancellation() -> None:
    (outcome,) = ab.run_batch(
        Waits(), requests(1), timeout=0.05, retry=ab.RetryPolicy(max_attempts=1), return_exceptions=True
    )
    assert isinstance(outcome, ab.BackendTimeoutError)
    assert str(outcome) == "attempt 1 took longer than 0.05 s [waits] (request p0)"
    assert outcome.__cause__ is None  # the sweeper's CancelledError is how, not why


def test_the_bar_marks_errors_without_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    ab.run_batch(Bare(), requests(2), progress=True, return_exceptions=True)
    assert "errors=yes" in capsys.readouterr().err


def test_cache_read_failures_count_only_failures_and_need_no_metrics(tmp_path: Path) -> None:
    metrics = ab.RunMetrics()
    ab.run_batch(ab.create_backend("mock"), requests(3), cache=tmp_path / "ok.sqlite", metrics=metrics)
    assert metrics.cache_read_failures == 0
    broken = ab.ResponseCache(tmp_path / "broken.sqlite")
    broken._db.execute("DROP TABLE results")
    try:
        with pytest.warns(CacheReadWarning):
            outcomes = ab.run_batch(ab.create_backend("mock"), requests(3), cache=broken)
        assert [o.text for o in outcomes] == ["p0", "p1", "p2"]
        assert broken.read_failures == 3
    finally:
        broken.close()
