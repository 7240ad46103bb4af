"""The run's per-attempt timing at its edges: tests that fail when a branch of `_run.Run.attempt` goes."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

import asyncbackends as ab
from asyncbackends._clock import AttemptClock
from asyncbackends._run import Run
from asyncbackends.options import RunOptions


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
