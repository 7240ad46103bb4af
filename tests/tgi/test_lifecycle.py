"""Concurrency as the server sees it, token redaction, readiness, closing, and a server that goes away."""

from __future__ import annotations

import asyncio
import logging
import pickle
import time

import pytest

import asyncbackends as ab
from asyncbackends._cache import backend_fingerprint
from asyncbackends.testing.fake_tgi import FakeTGIServer, Limits

from .conftest import TOKEN, MakeBackend, MakeServer, fast_retry, until


def requests(count: int, max_tokens: int = 8) -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=max_tokens)) for i in range(count)]


@pytest.mark.asyncio
@pytest.mark.parametrize("concurrency", [1, 5, 12])
async def test_concurrency_bound_seen_by_server(
    make_server: MakeServer, make_backend: MakeBackend, concurrency: int
) -> None:
    # 0.3 s per request: long enough for every worker to be in flight at once on a loaded machine.
    server = await make_server(latency=0.3)
    backend = await make_backend(server.url)
    await ab.gather(backend, requests(2 * concurrency), concurrency=concurrency)
    assert server.max_in_flight == concurrency


@pytest.mark.asyncio
async def test_connection_pool_bounds_in_flight(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server(latency=0.02)
    backend = await make_backend(server.url, max_connections=3)
    results = await ab.gather(backend, requests(20), concurrency=10)
    assert server.max_in_flight == 3 and len(results) == 20


@pytest.mark.asyncio
async def test_capability_hint_is_gathers_default(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server(latency=0.02)
    backend = await make_backend(server.url, max_concurrency=4)
    await ab.gather(backend, requests(20))
    assert server.max_in_flight == 4


@pytest.mark.asyncio
async def test_token_sent_but_never_shown(
    make_server: MakeServer, make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server = await make_server(
        fail_attempts=1, failure=503, limits=Limits(max_input_tokens=4, max_total_tokens=8)
    )
    backend = await make_backend(server.url, headers={"X-Extra": "1"})
    outcomes = await ab.gather(
        backend,
        [*requests(2, 2), ab.GenerationRequest("too long", ab.SamplingParams(max_tokens=2))],
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert server.authorization == {f"Bearer {TOKEN}": 3}
    shown = [repr(vars(backend)), repr(backend), repr(vars(backend._http)), caplog.text]
    shown += [f"{o!s} {o!r}" for o in outcomes]
    shown.append(repr(backend_fingerprint(backend)))
    assert all(TOKEN not in text for text in shown)
    assert any(isinstance(o, ab.RequestRejectedError) for o in outcomes)
    with pytest.raises(TypeError):
        pickle.dumps(backend._http._auth_header)


@pytest.mark.asyncio
async def test_authorization_header_option_is_hidden_too(
    server: FakeTGIServer, make_backend: MakeBackend
) -> None:
    backend = await make_backend(server.url, token=False, headers={"Authorization": "Bearer proxy-SECRET"})
    await ab.gather(backend, requests(1))
    assert server.authorization == {"Bearer proxy-SECRET": 1}
    assert "proxy-SECRET" not in repr(vars(backend)) + repr(vars(backend._http))


@pytest.mark.asyncio
async def test_ambient_token_is_not_sent_to_a_plain_http_server(
    server: FakeTGIServer, make_backend: MakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_fromENV_987")
    ambient = await make_backend(server.url, token=None)
    explicit = await make_backend(server.url, token="hf_explicit_654")
    await ab.gather(ambient, requests(1))
    await ab.gather(explicit, requests(1))
    assert server.authorization == {None: 1, "Bearer hf_explicit_654": 1}
    assert "hf_fromENV_987" not in repr(vars(ambient)) + repr(vars(ambient._http))


@pytest.mark.asyncio
async def test_wait_until_ready(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server()
    server.healthy = False
    backend = await make_backend(server.url)
    waiting = asyncio.ensure_future(
        ab.get_loop_manager().arun(backend.wait_until_ready(timeout=60, interval=0.05))
    )
    async with asyncio.timeout(30):
        while server.paths["/health"] < 2:  # noqa: ASYNC110  (the state is a counter the server bumps)
            await asyncio.sleep(0.01)
    assert not waiting.done()
    server.healthy = True
    await waiting
    assert server.statuses[503] >= 2 and server.statuses[200] >= 1


@pytest.mark.asyncio
async def test_wait_until_ready_times_out(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server()
    server.healthy = False
    backend = await make_backend(server.url)
    with pytest.raises(ab.BackendTimeoutError, match=r"not ready after 0\.3 s"):
        await ab.get_loop_manager().arun(backend.wait_until_ready(timeout=0.3, interval=0.05))
    assert server.paths["/health"] >= 2


@pytest.mark.asyncio
async def test_server_goes_away_mid_run(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server(latency=0.03)
    backend = await make_backend(server.url)
    batch = requests(80)
    answered: list[ab.RequestDone] = []

    def keep_successes(done: ab.RequestDone) -> None:
        if done.error_type is None:
            answered.append(done)

    async def kill_mid_run() -> None:
        # Once the run has results (not after a delay a loaded machine may spend before the first answer):
        # at 8 at a time, 30 ms each, most of the 80 are still to come.
        await until(lambda: len(answered) >= 1)
        await server.stop()

    killer = asyncio.ensure_future(kill_mid_run())
    start = time.monotonic()
    outcomes = await ab.gather(
        backend, batch, concurrency=8, retry=fast_retry(3), return_exceptions=True,
        callbacks=ab.RunCallbacks(on_request_done=keep_successes),
    )  # fmt: skip
    await killer
    assert time.monotonic() - start < 10
    done = [o for o in outcomes if isinstance(o, ab.GenerationResult)]
    failed = [o for o in outcomes if isinstance(o, ab.BackendError)]
    assert len(done) + len(failed) == len(batch) and done and failed
    assert all(isinstance(o, ab.BackendUnavailableError) for o in failed)
    assert all(
        o.text == r.prompt for o, r in zip(outcomes, batch, strict=True) if isinstance(o, ab.GenerationResult)
    )


@pytest.mark.asyncio
async def test_closed_backend(server: FakeTGIServer, make_backend: MakeBackend) -> None:
    backend = await make_backend(server.url)
    await ab.gather(backend, requests(1))
    await backend.aclose()
    await backend.aclose()  # idempotent
    with pytest.raises(ab.BackendClosedError):
        await ab.gather(backend, requests(1))
    assert backend._http._session is None


def test_sync_use_through_run_batch() -> None:
    # A server in its own loop thread, the adapter used from sync code twice (two batches, one session).
    manager = ab.get_loop_manager()
    server = manager.run(FakeTGIServer().start())
    try:
        backend = ab.create_backend("tgi", url=server.url, token=False)
        first = ab.run_batch(backend, requests(3))
        second = ab.run_batch(backend, [ab.LoglikelihoodRequest("a", "b")])
        assert [r.text for r in first] == ["p0", "p1", "p2"] and second[0].num_tokens == 1
        backend.close()
    finally:
        manager.run(server.stop())
    assert server.schema_violations == []
