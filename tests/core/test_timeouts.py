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


def test_run_options_store_the_one_timeouts_they_mean() -> None:
    # Normalised once, when the options are built: the run reads a Timeouts, never a number or None.
    assert ab.RunOptions(timeout=30).timeout == ab.Timeouts(total=30.0, idle=None)
    assert ab.RunOptions(timeout=None).timeout == ab.Timeouts(total=None, idle=None)
    given = ab.Timeouts(total=5, idle=7)
    assert ab.RunOptions(timeout=given).timeout is given and ab.RunOptions(timeout=given).timeouts is given
    assert ab.RunOptions(timeout=2.5).timeouts == ab.Timeouts(total=2.5, idle=None)


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


class Gate(BaseBackend):
    """Each prompt's call says when it has begun (its caller then holds a slot) and answers once let go."""

    name = "gate"
    capabilities = ab.Capabilities()

    def __init__(self) -> None:
        self.began: dict[str, asyncio.Event] = {}
        self.let_go: dict[str, asyncio.Event] = {}

    def events(self, prompt: str) -> tuple[asyncio.Event, asyncio.Event]:
        return self.began.setdefault(prompt, asyncio.Event()), self.let_go.setdefault(prompt, asyncio.Event())

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        began, let_go = self.events(str(request.prompt))
        began.set()
        await let_go.wait()
        return ab.GenerationResult(request.request_id, (ab.Completion(str(request.prompt)),))

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        raise NotImplementedError


def test_limited_total_counts_from_when_a_direct_call_holds_its_slot() -> None:
    # "a" holds the only slot and is never let go: its own total cuts it. "b", called meanwhile, waits for
    # the slot, gets it, and is let go only after a total counted from its call would have run out: it
    # answers because its total counts from when it got the slot; a clock started at its call would have
    # cut it. (Run on the shared loop, where the wrapper's slots live, so the gate's events and the calls
    # share one loop. The one timed wait is the deadline a wrong clock would have: elapsed time is what
    # is tested.)
    total = 1.0
    gate = Gate()
    shared = ab.limited(gate, concurrency=1, timeout=total)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        a = asyncio.ensure_future(shared.generate(ab.GenerationRequest("a", request_id="a")))
        await gate.events("a")[0].wait()  # "a" holds the slot
        called: list[float] = []

        async def call_b() -> ab.GenerationResult:
            # Read in the step that enters the wrapper: no later than any clock the call starts.
            called.append(loop.time())
            return await shared.generate(ab.GenerationRequest("b", request_id="b"))

        b = asyncio.ensure_future(call_b())
        began_b, let_go_b = gate.events("b")
        # "b" holds the slot once "a" was cut by its own total, the only way it lets go (or "b" ended first).
        holds = asyncio.ensure_future(began_b.wait())
        await asyncio.wait([holds, b], return_when=asyncio.FIRST_COMPLETED)
        assert holds.done() and not b.done(), b
        with pytest.raises(BackendTimeoutError, match="longer than the limited backend's 1 s") as cut:
            await a
        assert cut.value.request_id == "a"
        # A clock started at "b"'s call runs out at called + total: let that pass while "b" holds the slot.
        await asyncio.sleep(called[0] + total + 0.05 - loop.time())
        assert not b.done()
        let_go_b.set()
        assert (await b).text == "b"

    ab.get_loop_manager().run(scenario())


@pytest.mark.asyncio
async def test_limited_total_bounds_a_direct_call() -> None:
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
