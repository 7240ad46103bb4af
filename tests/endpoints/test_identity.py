"""An endpoint's cache identity (the model its server serves) and closing with requests in flight."""

from __future__ import annotations

import asyncio

import pytest

import asyncbackends as ab
from asyncbackends._cache import backend_fingerprint
from asyncbackends.testing.fake_endpoints import FakeEndpointsAPI
from asyncbackends.testing.fake_tgi import FakeTGIServer

from .conftest import MakeBackend


@pytest.mark.asyncio
async def test_fingerprint_holds_the_model_the_server_serves(
    api: FakeEndpointsAPI, tgi: FakeTGIServer, make_backend: MakeBackend
) -> None:
    api.add("ep")
    tgi.model_id, tgi.model_sha = "acme/model-a", "aaa111"
    first = await make_backend()
    tgi.model_id, tgi.model_sha = "acme/model-a", "bbb222"  # same repository, redeployed at a new revision
    second = await make_backend()
    served = backend_fingerprint(first)["served"]
    assert served["model_id"] == "acme/model-a" and served["model_sha"] == "aaa111"
    assert backend_fingerprint(first) != backend_fingerprint(second)
    assert tgi.paths["/generate_stream"] == 0  # learned before any request


@pytest.mark.asyncio
async def test_requests_in_flight_during_aclose_end_closed(
    api: FakeEndpointsAPI, tgi: FakeTGIServer, make_backend: MakeBackend
) -> None:
    api.add("ep")
    tgi.fail_attempts, tgi.failure = 99, "hang"
    backend = await make_backend()
    run = asyncio.ensure_future(
        ab.gather(
            backend,
            [ab.GenerationRequest(f"p{i}") for i in range(3)],
            concurrency=3,
            retry=ab.RetryPolicy(max_attempts=1),
            return_exceptions=True,
        )
    )
    async with asyncio.timeout(10):
        while tgi.in_flight < 3:  # noqa: ASYNC110  (the state is a counter the server bumps)
            await asyncio.sleep(0.005)
    await ab.get_loop_manager().arun(backend.aclose())
    outcomes = await run
    assert all(isinstance(o, ab.BackendClosedError) and not o.retryable for o in outcomes), outcomes
