"""Adaptive concurrency: the limiter's rules one by one, then whole runs against servers of known capacity."""

from __future__ import annotations

import asyncio
import time

import pytest

import asyncbackends as ab
from asyncbackends._adaptive import MIN_ROUND, AdaptiveLimiter, Ticket
from asyncbackends._options import RunOptions

# Against a server that refuses past its capacity, the limit is judged on refusals alone: the mock serves on
# the client's own loop, where a loaded machine's scheduling delays read as queueing and, with the default
# latency signal, cut the limit to 1-3 (seen in 5 of 6 runs beside 3 busy loops). The latency signal has its
# own test, against a queueing server.
REFUSALS_ONLY = ab.AdaptiveConcurrency(latency_tolerance=None)


def requests(n: int) -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"p{i}", request_id=f"p{i}") for i in range(n)]


class Refusing(ab.BaseBackend):
    """Serves ``capacity`` requests at once, each for ``service`` s; beyond that answers 429 at once."""

    name = "refusing"

    def __init__(self, capacity: int, service: float = 0.005, retry_after: float | None = None) -> None:
        self.capacity, self.service, self.retry_after = capacity, service, retry_after
        self.in_flight = self.max_in_flight = self.refusals = self.served = 0
        self.refused_at: list[float] = []
        self.started_at: list[float] = []

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        now = time.monotonic()
        self.started_at.append(now)
        if self.in_flight >= self.capacity:
            self.refusals += 1
            self.refused_at.append(now)
            raise ab.RateLimitedError("Model is overloaded", retry_after=self.retry_after)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.service)
        finally:
            self.in_flight -= 1
        self.served += 1
        return ab.GenerationResult(request.request_id, (ab.Completion(str(request.prompt)),))


class Queueing(ab.BaseBackend):
    """Serves ``capacity`` requests at once, each for ``service`` s; the others wait in its queue."""

    name = "queueing"

    def __init__(self, capacity: int, service: float = 0.02) -> None:
        self.capacity, self.service = capacity, service
        self.slots = asyncio.Semaphore(capacity)
        self.waiting = self.max_waiting = 0
        self.queue_seen: list[int] = []  # requests already waiting when each one arrived

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.queue_seen.append(self.waiting)
        self.waiting += 1
        self.max_waiting = max(self.max_waiting, self.waiting)
        try:
            async with self.slots:
                self.waiting -= 1
                await asyncio.sleep(self.service)
        except BaseException:
            self.waiting -= 1
            raise
        return ab.GenerationResult(request.request_id, (ab.Completion(str(request.prompt)),))


# -- settings ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial": 0}, "initial must be an int >= 1"),
        ({"initial": 2.0}, "initial must be an int >= 1"),
        ({"min": True}, "min must be an int >= 1"),
        ({"min": 8, "initial": 4}, "min <= initial <= max"),
        ({"initial": 600}, "min <= initial <= max"),
        ({"backoff": 1.0}, "backoff must be a number in"),
        ({"backoff": 0}, "backoff must be a number in"),
        ({"latency_tolerance": 1.0}, "latency_tolerance must be a finite number > 1"),
        ({"latency_tolerance": float("inf")}, "latency_tolerance must be a finite number > 1"),
    ],
)
def test_bad_settings_are_refused_with_the_field_named(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=match):
        ab.AdaptiveConcurrency(**kwargs)  # type: ignore[arg-type]


def test_run_options_take_adaptive_by_name_or_settings_and_refuse_other_strings() -> None:
    assert RunOptions(concurrency="adaptive").concurrency == "adaptive"
    settings = ab.AdaptiveConcurrency(initial=4, min=2, max=64)
    assert RunOptions(concurrency=settings).concurrency is settings
    with pytest.raises(ab.InvalidRequestError, match="'adaptive', an AdaptiveConcurrency"):
        RunOptions(concurrency="auto")  # type: ignore[arg-type]
    with pytest.raises(ab.InvalidRequestError, match="concurrency must be"):
        ab.run_batch(ab.create_backend("mock"), requests(1), concurrency="Adaptive")  # type: ignore[arg-type]


# -- the limiter's rules, driven directly ---------------------------------------------------------------


def answer_round(limiter: AdaptiveLimiter, latency: float) -> None:
    """Answer one whole round (the limit, or `MIN_ROUND` answers), every attempt taking ``latency`` s."""

    async def main() -> None:
        size = left = max(limiter.limit, MIN_ROUND)
        while left:
            tickets = [await limiter.acquire() for _ in range(min(limiter.limit, left))]
            now = time.monotonic()
            for ticket in tickets:
                limiter.release(Ticket(now - latency, ticket.generation), None)
            left -= len(tickets)
        assert size

    asyncio.run(main())


def test_clean_rounds_double_the_limit_until_the_first_cut_then_add_a_tenth() -> None:
    limiter = AdaptiveLimiter(ab.AdaptiveConcurrency(initial=4, max=100, backoff=0.5))
    answer_round(limiter, 0.01)
    assert limiter.limit == 8
    answer_round(limiter, 0.01)
    assert limiter.limit == 16

    async def refuse() -> None:
        ticket = await limiter.acquire()
        limiter.release(ticket, ab.RateLimitedError("overloaded"))

    asyncio.run(refuse())
    assert limiter.limit == 8
    answer_round(limiter, 0.01)
    assert limiter.limit == 9  # additive now: + max(1, limit // 10)
    assert limiter.changes == {"clean_round": 3, "rate_limited": 1}
    assert (limiter.lowest, limiter.highest) == (4, 16)


def test_a_burst_of_refusals_cuts_once_and_503_is_overload() -> None:
    limiter = AdaptiveLimiter(ab.AdaptiveConcurrency(initial=20, backoff=0.5))

    async def main() -> None:
        tickets = [await limiter.acquire() for _ in range(20)]
        for ticket in tickets[:10]:  # all started before the first cut
            limiter.release(ticket, ab.RateLimitedError("overloaded"))
        assert limiter.limit == 10
        limiter.release(tickets[10], None)  # an old answer says nothing about the new limit
        ticket = await limiter.acquire()  # started after the cut: may cut again
        limiter.release(ticket, ab.BackendUnavailableError("503"))
        assert limiter.limit == 5
        for ticket in tickets[11:]:
            limiter.release(ticket, None)
        assert limiter.limit == 5

    asyncio.run(main())
    assert limiter.changes == {"rate_limited": 1, "overloaded": 1}


def test_the_limit_stays_within_min_and_max() -> None:
    limiter = AdaptiveLimiter(ab.AdaptiveConcurrency(initial=3, min=2, max=5, backoff=0.1))
    answer_round(limiter, 0.01)
    assert limiter.limit == 5

    async def refuse() -> None:
        ticket = await limiter.acquire()
        limiter.release(ticket, ab.RateLimitedError("overloaded"))

    asyncio.run(refuse())
    assert limiter.limit == 2
    asyncio.run(refuse())
    assert limiter.limit == 2
    assert limiter.changes == {"clean_round": 1, "rate_limited": 1}


def test_queueing_delay_holds_the_limit_then_lowers_it_by_the_gradient() -> None:
    limiter = AdaptiveLimiter(ab.AdaptiveConcurrency(initial=10, latency_tolerance=1.5))
    answer_round(limiter, 0.100)  # baseline 100 ms: clean, slow start doubles
    assert limiter.limit == 20
    answer_round(limiter, 0.140)  # 1.4x: past half-way to the tolerance, held
    assert (limiter.limit, limiter.holds) == (20, 1)
    answer_round(limiter, 0.300)  # 3x: lowered to 20 * 1.5 / 3
    assert limiter.limit == 10
    assert limiter.changes == {"clean_round": 1, "queueing": 1}
    answer_round(limiter, 0.110)  # back near the baseline: grows again, additively (slow start is over)
    assert limiter.limit == 11


def test_latency_is_ignored_without_a_tolerance() -> None:
    limiter = AdaptiveLimiter(ab.AdaptiveConcurrency(initial=4, latency_tolerance=None))
    answer_round(limiter, 0.01)
    answer_round(limiter, 1.0)
    assert limiter.limit == 16


def test_waiters_get_slots_as_they_free_up_and_when_the_limit_grows() -> None:
    async def main() -> None:
        limiter = AdaptiveLimiter(ab.AdaptiveConcurrency(initial=MIN_ROUND))
        held = [await limiter.acquire() for _ in range(MIN_ROUND)]
        first = asyncio.ensure_future(limiter.acquire())
        second = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0)
        assert not first.done() and limiter.in_flight == MIN_ROUND
        limiter.release(held[0], None)  # one answer of the round: the limit stays, one slot frees
        assert limiter.limit == MIN_ROUND
        held.append(await first)
        assert not second.done()
        for ticket in held[1:MIN_ROUND]:
            limiter.release(ticket, None)  # the round's last answer: the limit doubles
        assert limiter.limit == 2 * MIN_ROUND
        await second
        assert limiter.in_flight == 2

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_no_slot_taken() -> None:
    async def main() -> None:
        limiter = AdaptiveLimiter(ab.AdaptiveConcurrency(initial=1))
        ticket = await limiter.acquire()
        waiter = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        limiter.release(ticket, asyncio.CancelledError())
        assert limiter.in_flight == 0
        assert limiter.limit == 1 and not limiter.changes  # a cancelled attempt teaches nothing
        await asyncio.wait_for(limiter.acquire(), 5)

    asyncio.run(main())


def test_retry_after_pauses_every_new_attempt() -> None:
    async def main() -> None:
        limiter = AdaptiveLimiter(ab.AdaptiveConcurrency(initial=8))
        ticket = await limiter.acquire()
        refused = time.monotonic()
        limiter.release(ticket, ab.RateLimitedError("slow down", retry_after=0.2))
        await limiter.acquire()
        assert time.monotonic() - refused >= 0.2

    asyncio.run(main())


# -- whole runs -----------------------------------------------------------------------------------------


def test_against_a_refusing_server_nothing_is_lost_and_few_are_refused() -> None:
    server = Refusing(capacity=24, service=0.02)
    metrics = ab.RunMetrics()
    results = ab.run_batch(
        server,
        requests(1500),
        concurrency=REFUSALS_ONLY,
        retry=ab.RetryPolicy(max_attempts=10, initial_delay=0.01),
        metrics=metrics,
    )
    assert [r.completions[0].text for r in results] == [f"p{i}" for i in range(1500)]
    assert server.served == 1500 and server.max_in_flight == 24
    assert server.refusals <= 0.05 * 1500
    assert metrics.concurrency_changes["rate_limited"] >= 1
    assert 12 <= metrics.concurrency_limit <= 36  # type: ignore[operator]
    assert metrics.retried_errors["RateLimitedError"] == server.refusals


def test_against_a_queueing_server_the_limit_comes_down_to_its_capacity() -> None:
    async def main() -> tuple[Queueing, ab.RunMetrics]:
        server = Queueing(capacity=8)
        metrics = ab.RunMetrics()
        await ab.gather(
            server, requests(600), concurrency=ab.AdaptiveConcurrency(initial=64), metrics=metrics
        )
        return server, metrics

    server, metrics = ab.get_loop_manager().run(main())
    assert metrics.concurrency_changes["queueing"] >= 1
    assert metrics.limit_history[0][1] < 64
    # Bounds with room for a loaded machine, where the loop's own delays (the server runs on it) read as
    # queueing too: measured beside two busy loops, the limits' median was 3-19 and a late arrival's median
    # queue 0-16; a limit that never came down would give 64 and 56.
    limits = sorted(limit for _, limit, _ in metrics.limit_history)
    assert limits[len(limits) // 2] <= 40
    # The server's own queue: 56 deep at the start; over the second half of the run, a typical arrival
    # finds at most three times its capacity waiting (a fixed 64 would find 56).
    assert server.max_waiting >= 48
    late = sorted(server.queue_seen[300:])
    assert late[len(late) // 2] <= 24


def test_retry_after_pauses_the_run_and_the_limit_is_in_the_summary() -> None:
    server = Refusing(capacity=4, retry_after=0.3)
    metrics = ab.RunMetrics()
    ab.run_batch(
        server,
        requests(40),
        concurrency=ab.AdaptiveConcurrency(initial=16),
        # Which request meets which refusal depends on timing (a loaded machine stretches the 5 ms service):
        # attempts enough that no request runs out of them, as the test is about the pauses, not retries.
        retry=ab.RetryPolicy(max_attempts=20, initial_delay=0.0, jitter=False),
        metrics=metrics,
    )
    first = server.refused_at[0]
    # Nothing started between the first refusal and the end of its Retry-After (every worker waited).
    assert not [t for t in server.started_at if first < t < first + 0.3]
    summary = metrics.summary()
    assert summary["concurrency_limit"] == metrics.concurrency_limit
    assert summary["concurrency_changes"]["rate_limited"] >= 1
    assert summary["concurrency_lowest"] <= 14
    assert "concurrency (adaptive)" in metrics.format()


def test_a_fixed_limit_is_reported_too() -> None:
    metrics = ab.RunMetrics()
    ab.run_batch(ab.create_backend("mock"), requests(3), concurrency=5, metrics=metrics)
    assert metrics.summary()["concurrency_limit"] == 5
    assert metrics.summary()["concurrency_changes"] == {}


# -- ab.limited: one adaptive limit shared by every run ------------------------------------------------------


def test_limited_adaptive_is_one_limit_for_two_concurrent_runs() -> None:
    server = Refusing(capacity=24, service=0.02)
    shared = ab.limited(server, concurrency=REFUSALS_ONLY)
    retry = ab.RetryPolicy(max_attempts=10, initial_delay=0.01)

    async def main() -> list[list[ab.GenerationResult]]:
        # Each run alone may keep 512 in flight: only the shared limit keeps the server's refusals low.
        return list(
            await asyncio.gather(
                ab.gather(shared, requests(600), concurrency=512, retry=retry),
                ab.gather(shared, requests(600), concurrency=512, retry=retry),
            )
        )

    first, second = ab.get_loop_manager().run(main())
    assert [r.request_id for r in first] == [r.request_id for r in second] == [f"p{i}" for i in range(600)]
    assert server.served == 1200 and server.max_in_flight == 24
    assert server.refusals <= 0.05 * 1200
    assert shared.limiter is not None and shared.limiter.changes["rate_limited"] >= 1
    assert 12 <= shared.limiter.limit <= 36


def test_limited_refuses_a_bad_concurrency_naming_adaptive() -> None:
    with pytest.raises(
        ab.InvalidRequestError, match="'adaptive', an AdaptiveConcurrency or None, got 'auto'"
    ):
        ab.limited(ab.create_backend("mock"), concurrency="auto")  # type: ignore[arg-type]
    settings = ab.AdaptiveConcurrency(initial=2)
    assert ab.limited(ab.create_backend("mock"), concurrency=settings).concurrency is settings


def test_as_completed_takes_adaptive_too() -> None:
    server = Refusing(capacity=4, service=0.001)

    async def main() -> list[int]:
        seen = []
        async for index, result in ab.as_completed(
            server,
            requests(50),
            concurrency="adaptive",
            retry=ab.RetryPolicy(max_attempts=20, initial_delay=0),
        ):
            assert isinstance(result, ab.GenerationResult) and result.request_id == f"p{index}"
            seen.append(index)
        return seen

    assert sorted(asyncio.run(main())) == list(range(50))
    assert server.served == 50 and server.max_in_flight == 4 and server.refusals >= 1
