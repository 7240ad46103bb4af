"""Adapter affinity in the router: a LoRA adapter's requests stay where it is loaded while load allows.

Over mock replicas that serve adapters (their ``adapters`` option). Load is made by holding requests in
flight: a latency far longer than any test, the requests started together on the shared loop (where the
router lives), the assertions made once every one is in flight (the mocks' ``in_flight`` counters), then
the requests cancelled. Which replica served a request is read from the mocks' ``attempts`` (by request id).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pytest

import asyncbackends as ab
from asyncbackends._routing.choice import sibling_key
from asyncbackends._routing.router import ADAPTER_SLOTS, Replica, Router
from asyncbackends.adapters.mock import MockBackend

T = TypeVar("T")

NOW = ab.RetryPolicy(initial_delay=0)  # a failed attempt retried at once
HELD = 3600.0  # seconds an attempt of a held replica takes: never over within a test, cancelled at its end


def on_shared_loop(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run ``scenario`` on the shared loop, the router's: decisions there are made in the order of sending."""

    async def run() -> T:
        return await scenario()

    return ab.get_loop_manager().run(run())


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for a state (polled), with a generous safety net."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "state not reached"
        await asyncio.sleep(0.001)


def mocks(n: int = 2, adapters: Sequence[str] = ("a", "b"), **options: Any) -> list[MockBackend]:
    return [MockBackend(adapters=adapters, **options) for _ in range(n)]


def served_by(replicas: Sequence[MockBackend], request_id: str) -> int:
    """The index of the replica that got the (only) attempt of ``request_id``."""
    (index,) = [i for i, m in enumerate(replicas) if m.attempts[request_id]]
    return index


async def held(backend: Any, replicas: Sequence[MockBackend], requests: Sequence[Any]) -> Any:
    """Start ``requests`` in order and return their tasks once every one is in flight on a replica."""
    before = sum(m.in_flight for m in replicas)
    tasks = [asyncio.create_task(backend.generate(r)) for r in requests]
    await until(lambda: sum(m.in_flight for m in replicas) == before + len(requests))
    return tasks


async def cancel(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def gen(adapter: str | None, i: int) -> ab.GenerationRequest:
    return ab.GenerationRequest(f"prompt {i}", adapter=adapter, request_id=f"{adapter or 'base'}-{i}")


@pytest.mark.parametrize("routing", ["least_loaded", "affinity"])
def test_each_adapters_requests_stay_on_one_replica_while_load_allows(routing: str) -> None:
    replicas = mocks(latency=HELD)
    backend = ab.pool(replicas, routing=routing, seed=0)

    async def scenario() -> None:
        # Sent as a sweep sends them: the two adapters' requests interleaved, all in flight together.
        tasks = await held(backend, replicas, [gen(name, i) for i in range(12) for name in "ab"])
        homes = {name: {served_by(replicas, f"{name}-{i}") for i in range(12)} for name in "ab"}
        assert len(homes["a"]) == 1 and len(homes["b"]) == 1 and homes["a"] != homes["b"], homes
        await cancel(tasks)

    on_shared_loop(scenario)
    backend.close()


@pytest.mark.parametrize("capacity", [None, 32])
def test_one_adapter_spills_at_its_share_of_the_load_then_spreads(capacity: int | None) -> None:
    # With a capacity too (vLLM's concurrency hint): not kept below capacity, as a prefix is, or one
    # adapter's run would fill one engine while the other idles.
    replicas = mocks(latency=HELD)
    backend = ab.pool(replicas, capacities=[capacity, capacity], seed=0)

    async def scenario() -> None:
        tasks = await held(backend, replicas, [gen("a", i) for i in range(16)])
        order = [served_by(replicas, f"a-{i}") for i in range(16)]
        # Two in flight on its replica is 1.25 times its share of three: the third goes to the other.
        assert order[0] == order[1] != order[2], order
        assert sorted(m.in_flight for m in replicas) == [8, 8]  # then both hold it: spread by load
        await cancel(tasks)

    on_shared_loop(scenario)
    assert all(r.adapters_held == {"a": None} for r in backend.router.replicas)
    backend.close()


def test_requests_without_an_adapter_route_by_load_alone() -> None:
    replicas = mocks(latency=HELD)
    backend = ab.pool(replicas, seed=0)

    async def scenario() -> None:
        tasks = await held(backend, replicas, [gen(name, i) for i in range(4) for name in "ab"])
        a_home = served_by(replicas, "a-0")
        assert [m.in_flight for m in replicas] == [4, 4]
        base = await held(backend, replicas, [gen(None, i) for i in range(6)])
        assert [m.in_flight for m in replicas] == [7, 7]  # three each, whatever adapter each replica holds
        assert {served_by(replicas, f"a-{i}") for i in range(4)} == {a_home}
        await cancel(tasks + base)

    on_shared_loop(scenario)
    assert sorted(tuple(r.adapters_held) for r in backend.router.replicas) == [("a",), ("b",)]
    backend.close()


def test_when_its_replica_fails_the_adapter_moves_to_another_and_stays_there() -> None:
    replicas = mocks()
    backend = ab.pool(replicas, seed=0, cooldown=60)  # the failed one stays out for the test
    first = ab.run_batch(backend, [gen("a", i) for i in range(6)], concurrency=1)
    assert [r.text for r in first] == ["[a] prompt " + str(i) for i in range(6)]  # type: ignore[union-attr]
    (home,) = {served_by(replicas, f"a-{i}") for i in range(6)}
    other = 1 - home
    replicas[home].failure_rate = 1.0  # every attempt there fails from now on (BackendUnavailableError)
    later = ab.run_batch(backend, [gen("a", i) for i in range(6, 12)], concurrency=1, retry=NOW)
    assert all(isinstance(r, ab.GenerationResult) for r in later)
    assert replicas[home].attempts["a-6"] == 1 and replicas[other].attempts["a-6"] == 1  # the retry
    assert all(served_by(replicas, f"a-{i}") == other for i in range(7, 12))
    assert backend.replica_stats()[home].state == "cooling"
    backend.close()


def test_with_adapter_around_a_pool_keeps_every_kind_of_request_on_the_adapters_replica() -> None:
    replicas = mocks(adapters=("math",))
    backend = ab.with_adapter(ab.pool(replicas, seed=0), "math")
    requests: list[ab.Request] = []
    for i in range(5):
        requests += [
            ab.GenerationRequest(f"q{i}", request_id=f"g{i}"),
            ab.LoglikelihoodRequest(f"q{i}", " yes", request_id=f"l{i}"),
            ab.RollingLoglikelihoodRequest(f"text {i}", request_id=f"r{i}"),
        ]
    results = ab.run_batch(backend, requests, concurrency=1)
    assert [r.text for r in results[::3]] == [f"[math] q{i}" for i in range(5)]  # type: ignore[union-attr]
    (home,) = {served_by(replicas, r.request_id) for r in requests if r.request_id}
    assert sum(replicas[home].attempts.values()) == 15
    backend.close()


def test_replicas_serving_different_adapters_get_only_their_own() -> None:
    replicas = [MockBackend(adapters=("a",), latency=HELD), MockBackend(adapters=("b",), latency=HELD)]
    backend = ab.pool(replicas, seed=0)
    assert backend.capabilities.adapters

    async def scenario() -> None:
        # Eight of a alone: far over its share, but the other replica does not serve it, so no spill.
        tasks = await held(backend, replicas, [gen("a", i) for i in range(8)])
        assert [m.in_flight for m in replicas] == [8, 0]
        tasks += await held(backend, replicas, [gen("b", 0)])
        assert replicas[1].attempts["b-0"] == 1
        # A name neither serves: one replica refuses it with its own error, naming its adapters.
        with pytest.raises(ab.RequestRejectedError, match="has no adapter 'c'"):
            await backend.generate(gen("c", 0))
        await cancel(tasks)

    on_shared_loop(scenario)
    backend.close()


def test_an_adapters_retry_waits_for_a_replica_that_serves_it_rather_than_go_to_one_that_does_not() -> None:
    # Every request's first attempt fails on the replica serving a: it cools down, and the retry waits
    # for its probe to take it back instead of going to the healthy replica, which would refuse it.
    only_a, only_b = MockBackend(adapters=("a",), fail_attempts=1), MockBackend(adapters=("b",))
    backend = ab.pool([only_a, only_b], seed=0, cooldown=0.3)
    (result,) = ab.run_batch(backend, [gen("a", 0)], retry=NOW)  # retried while its replica cools down
    assert result.text == "[a] prompt 0"  # type: ignore[union-attr]
    assert only_a.attempts["a-0"] == 2 and sum(only_b.attempts.values()) == 0
    assert backend.replica_stats()[0].cooldowns == 1
    backend.close()


def test_a_pool_serves_adapters_only_where_every_replica_does() -> None:
    mixed = ab.pool([MockBackend(adapters=("a",)), MockBackend()])
    assert not mixed.capabilities.adapters
    assert mixed.capabilities.max_concurrency is None and mixed.capabilities.loglikelihood
    # Called directly, not through gather: refused before any replica could answer from its base model.
    with pytest.raises(ab.RequestRejectedError, match="serves no LoRA adapters"):
        ab.get_loop_manager().run(mixed.generate(gen("a", 0)))
    assert all(sum(r.backend.attempts.values()) == 0 for r in mixed.router.replicas)
    both = ab.pool([MockBackend(adapters=("a",), max_concurrency=2), MockBackend(adapters=("b",))])
    assert both.capabilities.adapters
    for backend in (mixed, both):
        backend.close()


# -- the pieces: what a replica is taken to hold, and what binds siblings --------------------------------


class Engine:
    """A stand-in replica that serves any adapter and says how many it holds at once."""

    capabilities = ab.Capabilities(adapters=True)
    max_loras = 2

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        raise NotImplementedError

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        raise NotImplementedError


def test_a_replica_holds_its_most_recent_adapters_up_to_its_slots() -> None:
    replica = Replica(Engine(), label="e")
    assert replica.adapters is None and replica.adapter_slots == 2
    for name in "abac":
        replica.hold_adapter(name)
    assert list(replica.adapters_held) == ["a", "c"]  # b, the least recently sent, was swapped out
    assert Replica(MockBackend(adapters=("x", "y", "z")), label="m").adapter_slots == 3
    plain = Replica(MockBackend(), label="p")
    assert plain.adapters == frozenset() and not plain.serves("a")
    assert Replica(object(), label="o").adapter_slots == ADAPTER_SLOTS


def test_an_adapter_swapped_out_everywhere_goes_by_load() -> None:
    engines = [Replica(Engine(), label=f"e{i}") for i in range(2)]
    router = Router(engines, seed=0)
    engines[0].hold_adapter("a")
    engines[0].in_flight = 1  # one of two in flight: within 1.25 times its share, so a stays there
    assert router.choose(gen("a", 0)) is engines[0]
    assert router.choose(gen(None, 0)) is engines[1]  # the base by load
    engines[0].hold_adapter("b")
    engines[0].hold_adapter("c")  # two slots: a was the least recent, so it is gone
    assert router.choose(gen("a", 0)) is engines[1]  # held nowhere: by load alone


def test_siblings_are_a_context_under_one_adapter() -> None:
    keys = {sibling_key(ab.LoglikelihoodRequest("Q: 2+2? A:", " 4", adapter=a)) for a in (None, "a", "b")}
    assert len(keys) == 3
    assert sibling_key(ab.LoglikelihoodRequest("Q: 2+2? A:", " 5", adapter="a")) in keys
