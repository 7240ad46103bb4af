"""The pool over in-process replicas (mock): capabilities, fingerprint, options, a dead replica's requests."""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._wrappers.pool import PoolBackend
from asyncbackends.adapters.mock import MockBackend
from asyncbackends.testing.fake_tgi import FakeTGIServer


class NoRolling(MockBackend):
    """A replica that cannot score rolling loglikelihoods, and has no check_ready of its own."""

    check_ready = None  # type: ignore[assignment]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.capabilities = ab.Capabilities(loglikelihood=True, chat=True, max_concurrency=3)


def test_capabilities_are_the_common_ones_and_concurrency_the_sum() -> None:
    backend = ab.pool([MockBackend(max_concurrency=5), NoRolling()])
    assert backend.capabilities.loglikelihood and backend.capabilities.chat
    assert not backend.capabilities.rolling_loglikelihood and not backend.capabilities.n_samples
    assert backend.capabilities.max_concurrency == 8
    with pytest.raises(ab.RequestRejectedError, match="loglikelihood_rolling"):
        ab.get_loop_manager().run(backend.loglikelihood_rolling(ab.RollingLoglikelihoodRequest("text")))
    assert ab.pool([MockBackend(), MockBackend(max_concurrency=2)]).capabilities.max_concurrency is None
    backend.close()


def test_fingerprint_is_the_model_not_the_replicas() -> None:
    two = ab.pool([MockBackend(model="m"), MockBackend(model="m")])
    three = ab.pool([MockBackend(model="m") for _ in range(3)], labels=["a", "b", "c"])
    other = ab.pool([MockBackend(model="n")])
    assert two.fingerprint == three.fingerprint != other.fingerprint
    assert two.fingerprint["model"] == "m"
    for backend in (two, three, other):
        backend.close()


def test_options_are_checked() -> None:
    with pytest.raises(ab.InvalidRequestError, match="at least one"):
        ab.pool([])
    with pytest.raises(ab.InvalidRequestError, match="capacity"):
        ab.pool([MockBackend()], capacities=[0])
    with pytest.raises(ab.InvalidRequestError, match="no generate"):
        ab.pool([object()])
    with pytest.raises(ab.InvalidRequestError, match="cannot be a pool"):
        ab.create_backend("pool", replicas=[{"backend": "pool", "replicas": []}])
    with pytest.raises(ab.InvalidRequestError, match="different models"):
        ab.pool([MockBackend(model="a"), MockBackend(model="b")])


def test_create_takes_the_router_options_the_pool_takes() -> None:
    # create names no router option itself: each of the router's is taken, a misspelled one refused by name.
    replicas = [{"backend": "mock"}, {"backend": "mock"}]
    with pytest.raises(ab.InvalidRequestError, match=r"'cooldwn' \(did you mean 'cooldown'"):
        ab.create_backend("pool", replicas=replicas, cooldwn=1)
    with pytest.raises(ab.InvalidRequestError, match="affinity_slack must be"):
        ab.create_backend("pool", replicas=replicas, affinity_slack=0.5)
    backend = ab.create_backend("pool", replicas=replicas, routing="affinity", seed=0, cooldown=7, wait=0.5)
    try:
        assert isinstance(backend, PoolBackend) and backend.routing == "affinity"
        assert backend.router.replicas.cooldown == 7 and backend.router.wait == 0.5
    finally:
        backend.close()


def test_a_dead_replica_costs_no_result() -> None:
    dead = MockBackend(failure_rate=1.0, failure="broken")
    alive = MockBackend()
    backend = ab.pool([dead, alive], capacities=[1, 1], cooldown=5)
    requests = [ab.GenerationRequest(f"p{i}") for i in range(20)]
    results = ab.run_batch(backend, requests, concurrency=2, retry=ab.RetryPolicy(initial_delay=0.001))
    assert [r.text for r in results] == [r.text for r in ab.run_batch(MockBackend(), requests)]
    stats = {s.label: s for s in backend.replica_stats()}
    assert stats["mock-0"].state == "cooling" and stats["mock-0"].requests == 1
    assert stats["mock-1"].successes == 20
    backend.close()
    assert dead.closed and alive.closed


def test_pool_readiness_follows_its_replicas() -> None:
    backend = ab.pool([MockBackend(failure_rate=1.0)], cooldown=5, wait=0.01)
    run = ab.get_loop_manager().run
    run(backend.check_ready())
    assert isinstance(backend, PoolBackend)
    with pytest.raises(ab.BackendUnavailableError):
        run(backend.generate(ab.GenerationRequest("x")))
    with pytest.raises(ab.BackendUnavailableError, match="no healthy replica"):
        run(backend.check_ready())
    backend.close()


@pytest.mark.asyncio
async def test_tgi_and_mock_readiness_probes() -> None:
    server = await FakeTGIServer(check_schema=False).start()
    try:
        tgi = await ab.acreate_backend("tgi", url=server.url, token=False)
        await ab.get_loop_manager().arun(tgi.check_ready())  # type: ignore[attr-defined]
        server.healthy = False
        with pytest.raises(ab.BackendUnavailableError, match="503"):
            await ab.get_loop_manager().arun(tgi.check_ready())  # type: ignore[attr-defined]
        assert server.paths["/health"] == 2
        await tgi.aclose()
    finally:
        await server.stop()
    mock = MockBackend(failure_rate=1.0)
    with pytest.raises(ab.BackendUnavailableError):
        await mock.check_ready()
    await mock.aclose()
    with pytest.raises(ab.BackendClosedError):
        await mock.check_ready()
