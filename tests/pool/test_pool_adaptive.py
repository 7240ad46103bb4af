"""Per-replica adaptive limits: a pool of unequal TGI look-alikes settles each replica at its own capacity.

The look-alikes serve on the test's loop and answer 429 "Model is overloaded" beyond their capacity, as TGI
does; the pool runs on the shared loop like any user's. Assertions are on what the servers saw (their
refusals, their most requests in flight) and on each replica's limit, never on timing. The latency signal is
off (``latency_tolerance=None``): client and servers share one loaded machine here, so latency says nothing
about a server's queue, and these tests are about refusals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._adaptive import AdaptiveLimiter
from asyncbackends._routing.replica_limits import PoolLimit
from asyncbackends._routing.router import Router
from asyncbackends._wrappers.pool import PoolBackend
from asyncbackends.testing.fake_tgi import FakeTGIServer, Limits

from .test_pool_tgi import MakeServer, make_pool, until
from .test_pool_tgi import make_server as make_server  # the fixture: look-alikes stopped after the test

SETTINGS = ab.AdaptiveConcurrency(initial=8, latency_tolerance=None)
RETRY = ab.RetryPolicy(max_attempts=50, initial_delay=0.001, max_delay=0.02)


async def refusing_server(make_server: MakeServer, capacity: int, **options: Any) -> FakeTGIServer:
    """A look-alike serving ``capacity`` generations at once (10 ms each), answering 429 beyond."""
    return await make_server(limits=Limits(max_concurrent_requests=capacity), latency=0.01, **options)


def requests(count: int) -> list[ab.GenerationRequest]:
    params = ab.SamplingParams(max_tokens=4)
    return [ab.GenerationRequest(f"p {i:04d}", params, request_id=str(i)) for i in range(count)]


def limiter_of(pool: PoolBackend, index: int) -> AdaptiveLimiter:
    limiter = pool.router.replicas[index].limiter
    assert limiter is not None
    return limiter


# -- unequal servers ---------------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("way", ["pool option", "run", "limited"])
async def test_unequal_replicas_settle_each_at_its_own_capacity(make_server: MakeServer, way: str) -> None:
    small, large = await refusing_server(make_server, 4), await refusing_server(make_server, 12)
    pool = await make_pool(
        [small, large], **({"replica_concurrency": SETTINGS} if way == "pool option" else {})
    )
    backend: Any = pool
    run_concurrency: Any = 64  # more than both capacities together: every replica is pushed to its limit
    if way == "run":
        run_concurrency = SETTINGS
    elif way == "limited":
        backend = ab.limited(pool, concurrency=SETTINGS)
    metrics = ab.RunMetrics()
    metrics.track_replicas(pool)
    try:
        results = await ab.gather(
            backend, requests(600), concurrency=run_concurrency, retry=RETRY, metrics=metrics
        )
        assert all(isinstance(r, ab.GenerationResult) for r in results)  # nothing lost
        assert metrics.successes == 600
        stats = {s.label: s for s in pool.replica_stats()}
        small_limit, large_limit = stats[small.url].limit, stats[large.url].limit
        assert small_limit is not None and large_limit is not None
        # Each settled near its own capacity: the small one's refusals never held the large one down.
        assert 3 <= small_limit <= 6, stats
        assert 9 <= large_limit <= 16, stats
        assert small.max_in_flight == 4 and large.max_in_flight >= 10
        assert stats[small.url].cooldowns == 0 and stats[large.url].cooldowns == 0  # cut, not cooled
        # Refusals bounded: the slow start's overshoot, then about one a round at each replica's edge.
        refused = small.statuses[429] + large.statuses[429]
        assert refused <= 0.15 * 600, (small.statuses, large.statuses)
        assert sum(s.successes for s in stats.values()) == 600
        tracked = metrics.summary()["replicas"]
        assert (tracked[small.url]["limit"], tracked[large.url]["limit"]) == (small_limit, large_limit)
        assert f"limit: {large_limit}" in metrics.format()
        assert stats[large.url].successes > stats[small.url].successes
        if way == "run":  # the run's own limit is the replicas' sum, moved when theirs moved
            assert metrics.concurrency_limit == small_limit + large_limit
            assert metrics.concurrency_changes
        if way == "limited":
            assert isinstance(backend.limiter, PoolLimit)
            assert backend.limiter.limit == small_limit + large_limit
    finally:
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_replica_of_known_capacity_is_never_given_more_than_it(make_server: MakeServer) -> None:
    small, large = await refusing_server(make_server, 4), await refusing_server(make_server, 12)
    # Told the small one's capacity (below the settings' initial of 8), not the large one's.
    replicas = [{"backend": "tgi", "url": small.url, "token": False, "capacity": 4}]
    replicas.append({"backend": "tgi", "url": large.url, "token": False})
    pool = await ab.acreate_backend("pool", replicas=replicas, replica_concurrency=SETTINGS)
    assert isinstance(pool, PoolBackend)
    try:
        assert [s.limit for s in pool.replica_stats()] == [4, 8]  # the small one starts at its capacity
        results = await ab.gather(pool, requests(400), concurrency=64, retry=RETRY)
        assert all(isinstance(r, ab.GenerationResult) for r in results)
        small_limiter = limiter_of(pool, 0)
        # Never above its capacity, so never refused; the large one found its own by its refusals.
        assert small_limiter.highest == 4 and small.statuses[429] == 0 and small.max_in_flight == 4
        assert large.statuses[429] >= 1 and limiter_of(pool, 1).highest > 8
    finally:
        await pool.aclose()


@pytest.mark.asyncio
async def test_a_refusal_on_one_replica_cuts_only_its_own_limit_and_pauses_only_it(
    make_server: MakeServer,
) -> None:
    tight = await refusing_server(make_server, 2, retry_after="1")
    roomy = await refusing_server(make_server, 1000)
    pool = await make_pool([tight, roomy], replica_concurrency=SETTINGS)
    try:
        results = await ab.gather(pool, requests(200), concurrency=24, retry=RETRY)
        assert all(isinstance(r, ab.GenerationResult) for r in results)
        assert tight.statuses[429] >= 1 and roomy.statuses[429] == 0
        tight_limiter, roomy_limiter = limiter_of(pool, 0), limiter_of(pool, 1)
        assert tight_limiter.changes["rate_limited"] >= 1
        assert tight_limiter.limit < SETTINGS.initial
        assert tight_limiter.paused_until > 0  # its Retry-After paused it ...
        assert roomy_limiter.paused_until == 0  # ... and only it
        assert "rate_limited" not in roomy_limiter.changes
        assert roomy_limiter.lowest == SETTINGS.initial and roomy_limiter.limit >= SETTINGS.initial
    finally:
        await pool.aclose()


# -- the router with limits, step by step -------------------------------------------------------------------


class Gated(ab.BaseBackend):
    """Answers only when its gate opens; counts what it was sent and what it holds."""

    name = "gated"

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.in_flight = 0
        self.gate: asyncio.Event | None = None

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.seen.append(str(request.request_id))
        if self.gate is None:
            self.gate = asyncio.Event()
        self.in_flight += 1
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        return ab.GenerationResult(request.request_id, (ab.Completion("ok"),))


ONE_EACH = ab.AdaptiveConcurrency(initial=1, min=1, max=1)


def on_shared_loop(scenario: Callable[[], Awaitable[None]]) -> None:
    ab.get_loop_manager().run(scenario())


def test_a_full_replica_is_passed_over_and_an_attempt_waits_for_the_first_free_slot() -> None:
    first, second = Gated(), Gated()
    pool = ab.pool([first, second], replica_concurrency=ONE_EACH)

    async def scenario() -> None:
        tasks = [
            asyncio.create_task(pool.generate(ab.GenerationRequest("x", request_id=str(i)))) for i in range(3)
        ]
        await until(lambda: first.in_flight == 1 and second.in_flight == 1)  # one each: neither took two
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(first.seen) + len(second.seen) == 2  # the third waits, sent nowhere
        assert [s.limit for s in pool.replica_stats()] == [1, 1]
        assert first.gate is not None
        first.gate.set()  # the first replica's slot frees up: the waiting attempt goes there
        await until(lambda: len(first.seen) == 2)
        assert len(second.seen) == 1
        assert second.gate is not None
        second.gate.set()
        results = await asyncio.gather(*tasks)
        assert [r.request_id for r in results] == ["0", "1", "2"]
        await pool.aclose()

    on_shared_loop(scenario)


def test_closing_the_pool_ends_attempts_waiting_for_a_slot() -> None:
    only = Gated()
    pool = ab.pool([only], replica_concurrency=ONE_EACH)

    async def scenario() -> None:
        held = asyncio.create_task(pool.generate(ab.GenerationRequest("a", request_id="a")))
        waiting = asyncio.create_task(pool.generate(ab.GenerationRequest("b", request_id="b")))
        await until(lambda: only.in_flight == 1)
        for _ in range(10):
            await asyncio.sleep(0)
        assert only.seen == ["a"] and not waiting.done()
        await pool.router.aclose()  # the router first: the waiter is released before any replica closes
        with pytest.raises(ab.BackendClosedError):
            await waiting
        assert only.seen == ["a"]
        assert only.gate is not None
        only.gate.set()
        await held
        await pool.aclose()

    on_shared_loop(scenario)


def test_replica_concurrency_is_checked_before_anything_starts() -> None:
    with pytest.raises(ab.InvalidRequestError, match="replica_concurrency must be 'adaptive'"):
        ab.pool([Gated()], replica_concurrency=8)
    with pytest.raises(ab.InvalidRequestError, match="replica_concurrency must be 'adaptive'"):
        Router.check_options(replica_concurrency="auto")
    adaptive, plain = ab.pool([Gated()], replica_concurrency="adaptive"), ab.pool([Gated()])
    try:
        assert adaptive.replica_stats()[0].limit == ab.AdaptiveConcurrency().initial
        assert plain.replica_stats()[0].limit is None  # no per-replica limit unless asked
    finally:
        adaptive.close()
        plain.close()
