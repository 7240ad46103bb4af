"""`ab.Timeouts`: what ``timeout=`` means, how the idle limit reaches an adapter, `limited`'s own limits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.abc import BaseBackend, idle_timeout
from asyncbackends.adapters.mock import MockBackend
from asyncbackends.errors import BackendTimeoutError


class IdleProbe(BaseBackend):
    """Answers after ``delay`` and records the idle limit each call saw."""

    name = "probe"
    capabilities = ab.Capabilities()

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.seen: list[float | None] = []

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.seen.append(idle_timeout())
        await asyncio.sleep(self.delay)
        return ab.GenerationResult(request.request_id, (ab.Completion("ok"),))

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        raise NotImplementedError


def test_defaults_and_what_a_plain_value_means() -> None:
    from asyncbackends._timeouts import as_timeouts

    assert ab.Timeouts() == ab.Timeouts(total=None, idle=120.0)
    assert ab.RunOptions().timeout == ab.Timeouts()  # the default when the caller gives nothing
    assert as_timeouts(30) == ab.Timeouts(total=30, idle=None)  # a number keeps its meaning: a total alone
    assert as_timeouts(None) == ab.Timeouts(total=None, idle=None)  # no limit at all, as before


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: ab.Timeouts(total=0),
            "Timeouts.total must be a finite number of seconds > 0 or None, got 0",
        ),
        (lambda: ab.Timeouts(idle=float("inf")), "Timeouts.idle must be a finite number of seconds > 0"),
        (lambda: ab.Timeouts(idle=True), "Timeouts.idle must be"),  # type: ignore[arg-type]
        (lambda: ab.RunOptions(timeout="60"), "timeout must be an ab.Timeouts"),  # type: ignore[arg-type]
    ],
)
def test_bad_values_are_refused_by_name(build: Any, message: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=message.replace(".", r"\.")):
        build()


def test_each_attempt_sees_the_runs_idle_limit_and_nothing_leaks_out() -> None:
    probe = IdleProbe()
    requests = [ab.GenerationRequest(f"p{i}") for i in range(5)]
    ab.run_batch(probe, requests, concurrency=2)
    ab.run_batch(probe, requests, timeout=ab.Timeouts(idle=7), concurrency=2)
    ab.run_batch(probe, requests, timeout=30, concurrency=2)
    assert probe.seen == [120.0] * 5 + [7.0] * 5 + [None] * 5
    assert idle_timeout() is None  # outside a run: no limit


def test_the_total_still_bounds_an_attempt_whatever_the_idle_limit() -> None:
    probe = IdleProbe(delay=5)
    (outcome,) = ab.run_batch(
        probe, [ab.GenerationRequest("slow")], timeout=ab.Timeouts(total=0.05, idle=100),
        retry=ab.RetryPolicy(max_attempts=1), return_exceptions=True,
    )  # fmt: skip
    assert isinstance(outcome, BackendTimeoutError) and "longer than 0.05 s" in str(outcome)


def test_limited_sets_its_own_limits_and_the_tighter_one_wins() -> None:
    probe = IdleProbe()
    shared = ab.limited(probe, concurrency=2, timeout=ab.Timeouts(idle=5))
    requests = [ab.GenerationRequest(f"p{i}") for i in range(3)]
    ab.run_batch(shared, requests)  # the run's default 120 s: the wrapper's 5 s is tighter
    ab.run_batch(shared, requests, timeout=ab.Timeouts(idle=1))  # the run's 1 s is tighter
    ab.run_batch(shared, requests, timeout=None)  # the run sets none: the wrapper's alone
    assert probe.seen == [5.0] * 3 + [1.0] * 3 + [5.0] * 3
    assert "timeout=Timeouts(total=None, idle=5)" in repr(shared)


@pytest.mark.asyncio
async def test_limited_total_bounds_a_direct_call_from_when_it_holds_a_slot() -> None:
    shared = ab.limited(MockBackend(latency=5), concurrency=1, timeout=0.05)
    with pytest.raises(BackendTimeoutError, match=r"longer than the limited backend's 0\.05 s") as raised:
        await shared.generate(ab.GenerationRequest("slow", request_id="s-1"))
    assert raised.value.request_id == "s-1"
    fast = ab.limited(MockBackend(latency=0), timeout=0.5)
    assert (await fast.generate(ab.GenerationRequest("quick"))).text == "quick"


class OwnTimeout(BaseBackend):
    """Fails every call with its own `BackendTimeoutError`, as an adapter reports an idle stall."""

    name = "own-timeout"
    capabilities = ab.Capabilities()

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        raise BackendTimeoutError("no data for 0.5 s (the idle timeout)", backend="x", request_id="r-7")

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        raise NotImplementedError


@pytest.mark.asyncio
async def test_limited_lets_the_backends_own_timeout_through_unchanged() -> None:
    # Only the wrapper's own total is the wrapper's to name; a backend's timeout keeps its words and id.
    shared = ab.limited(OwnTimeout(), concurrency=1, timeout=ab.Timeouts(total=60, idle=5))
    with pytest.raises(BackendTimeoutError) as raised:
        await shared.generate(ab.GenerationRequest("p", request_id="r-7"))
    assert raised.value.request_id == "r-7" and raised.value.backend == "x"
    assert str(raised.value).startswith("no data for 0.5 s (the idle timeout)")


def test_limited_refuses_a_bad_timeout() -> None:
    with pytest.raises(ab.InvalidRequestError, match="timeout must be"):
        ab.limited(MockBackend(), timeout=-1)
