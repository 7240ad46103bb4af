"""A pool over several TGI look-alikes: a replica killed, one answering 503, one slow, mixed models, a cache.

The look-alikes serve on the test's loop; the pool runs on the shared loop like any user's. Tests wait for
states (a counter a server keeps, a replica's state), never for a guessed time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import asyncbackends as ab
from asyncbackends._wrappers.pool import PoolBackend
from asyncbackends.testing.fake_tgi import FakeTGIServer

FAST_RETRY = ab.RetryPolicy(max_attempts=5, initial_delay=0.01, max_delay=0.05)
MakeServer = Callable[..., Awaitable[FakeTGIServer]]


@pytest_asyncio.fixture
async def make_server() -> AsyncIterator[MakeServer]:
    servers: list[FakeTGIServer] = []

    async def make(**options: Any) -> FakeTGIServer:
        options.setdefault("check_schema", False)
        server = await FakeTGIServer(**options).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()


async def make_pool(servers: list[FakeTGIServer], **options: Any) -> PoolBackend:
    replicas = [{"backend": "tgi", "url": s.url, "token": False} for s in servers]
    backend = await ab.acreate_backend("pool", replicas=replicas, **options)
    assert isinstance(backend, PoolBackend)
    return backend


def requests(count: int, tag: str = "p") -> list[ab.GenerationRequest]:
    return [
        ab.GenerationRequest(f"{tag} {i:04d}", ab.SamplingParams(max_tokens=4), request_id=str(i))
        for i in range(count)
    ]


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for a state (polled), with a generous safety net."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "state not reached"
        await asyncio.sleep(0.002)


def generated(server: FakeTGIServer) -> int:
    return server.paths["/generate_stream"]


@pytest.mark.asyncio
async def test_replica_killed_mid_run_loses_nothing_and_answers_each_once(make_server: MakeServer) -> None:
    servers = [await make_server(latency=0.01) for _ in range(3)]
    backend = await make_pool(servers)
    reqs = requests(300)
    run = asyncio.ensure_future(ab.gather(backend, reqs, concurrency=12, retry=FAST_RETRY))
    await until(lambda: generated(servers[0]) >= 20)
    await servers[0].stop()  # connections in flight dropped, the port closed
    results = await run
    assert [r.request_id for r in results] == [r.request_id for r in reqs]
    expected = {r.prompt: None for r in reqs}
    answered: dict[str, int] = {}
    for server in servers:
        for key, count in server.answered.items():
            answered[key] = answered.get(key, 0) + count
    assert set(answered) == set(expected) and set(answered.values()) == {1}
    stats = {s.label: s for s in backend.replica_stats()}
    killed = stats[servers[0].url]
    assert killed.state == "cooling" and killed.cooldowns >= 1
    assert sum(s.successes for s in stats.values()) == 300
    await backend.aclose()


@pytest.mark.asyncio
async def test_replica_answering_503_gets_few_requests_then_traffic_after_recovery(
    make_server: MakeServer,
) -> None:
    healthy = [await make_server(latency=0.005) for _ in range(2)]
    sick = await make_server(latency=0.005, rate_503=1.0)
    sick.healthy = False  # its proxy answers 503 to everything, /health included
    backend = await make_pool([*healthy, sick], cooldown=0.02, max_cooldown=0.2)
    metrics = ab.RunMetrics()
    metrics.track_replicas(backend)
    results = await ab.gather(backend, requests(200), concurrency=6, retry=FAST_RETRY, metrics=metrics)
    assert len(results) == 200 and metrics.failed == 0
    # Only the first wave reached it (6 workers over 3 replicas); after its first 503 it cooled down.
    assert generated(sick) <= 3
    await until(lambda: sick.paths["/health"] >= 3)  # probed meanwhile, still sick
    assert generated(sick) <= 3
    figures = metrics.summary()["replicas"]
    assert figures[sick.url]["cooldowns"] >= 1 and figures[sick.url]["state"] == "cooling"
    assert "replica " + sick.url in metrics.format()

    sick.rates[503], sick.healthy = 0.0, True
    await until(lambda: backend.replica_stats()[2].state == "healthy")  # its probe took it back
    before = generated(sick)
    await ab.gather(backend, requests(300, "q"), concurrency=6, retry=FAST_RETRY)
    assert generated(sick) - before >= 50  # back in rotation: about a third of 300
    await backend.aclose()


@pytest.mark.asyncio
async def test_slow_replica_gets_fewer_requests(make_server: MakeServer) -> None:
    fast = await make_server(latency=0.005)
    slow = await make_server(latency=0.2)  # 40x: a loaded machine's own delays still leave it far slower
    backend = await make_pool([fast, slow])
    await ab.gather(backend, requests(300), concurrency=8)
    assert generated(slow) * 3 < generated(fast)
    assert generated(slow) > 0
    await backend.aclose()


@pytest.mark.asyncio
async def test_mixed_models_refused_before_anything_is_sent(make_server: MakeServer) -> None:
    a = await make_server(model_id="org/model-a")
    b = await make_server(model_id="org/model-b")
    with pytest.raises(ab.InvalidRequestError, match="different models"):
        await make_pool([a, b])
    lazy = ab.pool(  # built on a running loop: the models are read before the first request
        [ab.create_backend("tgi", url=a.url, token=False), ab.create_backend("tgi", url=b.url, token=False)]
    )
    outcomes = await ab.gather(lazy, requests(5), return_exceptions=True)
    assert all(isinstance(o, ab.InvalidRequestError) for o in outcomes)
    assert generated(a) == generated(b) == 0
    await lazy.aclose()


@pytest.mark.asyncio
async def test_a_replica_serving_another_model_later_is_refused(make_server: MakeServer) -> None:
    a = await make_server()
    late = await make_server(model_id="org/another")
    late_url = late.url
    await late.stop()  # unreachable when the pool starts: its model is unknown
    backend = await make_pool([a, late], cooldown=0.01)
    restarted = await make_server(model_id="org/another", port=int(late_url.rsplit(":", 1)[1]))
    await until(lambda: backend.replica_stats()[1].state == "refused")
    await ab.gather(backend, requests(20))
    assert generated(restarted) == 0 and generated(a) == 20
    assert "serves 'org/another'" in (backend.replica_stats()[1].last_error or "")
    await backend.aclose()


@pytest.mark.asyncio
async def test_one_cache_serves_a_different_set_of_replicas(make_server: MakeServer, tmp_path: Path) -> None:
    cache = tmp_path / "pool.sqlite"
    first = [await make_server() for _ in range(2)]
    backend = await make_pool(first)
    expected = await ab.gather(backend, requests(20), cache=cache)
    fingerprint = backend.fingerprint
    await backend.aclose()
    assert "127.0.0.1" not in str(fingerprint)

    others = [await make_server() for _ in range(3)]
    replaced = await make_pool(others)
    assert replaced.fingerprint == fingerprint
    again = await ab.gather(replaced, requests(20), cache=cache)
    assert again == expected and sum(generated(s) for s in others) == 0
    await replaced.aclose()

    other_model = await make_pool([await make_server(model_id="org/other")])
    assert other_model.fingerprint != fingerprint
    await ab.gather(other_model, requests(3), cache=cache)
    await other_model.aclose()


@pytest.mark.asyncio
async def test_replicas_file_and_aclose_closes_every_replica(make_server: MakeServer, tmp_path: Path) -> None:
    servers = [await make_server() for _ in range(2)]
    file = tmp_path / "replicas.toml"
    lines = ['routing = "affinity"']
    for s in servers:
        lines += ["[[replicas]]", 'backend = "tgi"', f'url = "{s.url}"', "token = false", "capacity = 4"]
    file.write_text("\n".join(lines) + "\n")
    backend = await ab.acreate_backend("pool", replicas=str(file))
    assert isinstance(backend, PoolBackend)
    assert backend.routing == "affinity" and backend.capabilities.max_concurrency == 8
    await ab.gather(backend, requests(10))
    await backend.aclose()
    await backend.aclose()  # idempotent
    assert all(getattr(r.backend, "closed", False) for r in backend.router.replicas)
    with pytest.raises(ab.BackendClosedError):
        await backend.generate(requests(1)[0])


@pytest.mark.asyncio
async def test_bad_replicas_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ab.InvalidRequestError, match="backend"):
        await ab.acreate_backend("pool", replicas=[{"url": "http://127.0.0.1:9"}])
    with pytest.raises(ab.InvalidRequestError, match="replicas file"):
        await ab.acreate_backend("pool", replicas=str(tmp_path / "missing.toml"))
    with pytest.raises(ab.InvalidRequestError, match="routing"):
        await ab.acreate_backend("pool", replicas=[{"backend": "mock"}], routing="random")


@pytest.mark.asyncio
async def test_affinity_keeps_each_prefix_on_one_replica(make_server: MakeServer) -> None:
    servers = [await make_server(latency=0.002) for _ in range(3)]
    replicas = [{"backend": "tgi", "url": s.url, "token": False, "capacity": 4} for s in servers]
    backend = await ab.acreate_backend("pool", replicas=replicas, routing="affinity", affinity_chars=40)
    assert isinstance(backend, PoolBackend)
    shots = [f"Task {t}: " + "Q: what is it? A: it is so.\n" * 3 for t in range(6)]
    reqs = [
        ab.GenerationRequest(shot + f"Q: question {q}? A:", ab.SamplingParams(max_tokens=2))
        for q in range(10)
        for shot in shots
    ]
    await ab.gather(backend, reqs, concurrency=3)  # below every replica's capacity: never spilled
    for shot in shots:
        holders = [s for s in servers if any(key.startswith(shot) for key in s.answered)]
        assert len(holders) == 1, "a prefix was spread over replicas"
    assert sum(1 for s in servers if s.answered) >= 2  # and the prefixes themselves are spread
    await backend.aclose()
