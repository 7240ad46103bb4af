"""Fixtures for the endpoints adapter: a TGI look-alike as the endpoint's server, the Endpoints API
look-alike in front of it, and huggingface_hub pointed at the latter (both on the test's loop)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

import asyncbackends as ab
from asyncbackends.adapters.endpoints import EndpointsBackend
from asyncbackends.testing.fake_endpoints import FakeEndpointsAPI
from asyncbackends.testing.fake_tgi import FakeTGIServer

TOKEN = "hf_ENDPOINTSsecret_0123456789abcdef"

MakeBackend = Callable[..., Awaitable[EndpointsBackend]]


@pytest_asyncio.fixture
async def tgi() -> AsyncIterator[FakeTGIServer]:
    async with FakeTGIServer() as server:
        yield server


@pytest_asyncio.fixture
async def api(tgi: FakeTGIServer, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeEndpointsAPI]:
    from huggingface_hub import constants

    async with FakeEndpointsAPI(upstream=tgi.url, token=TOKEN) as fake:
        # huggingface_hub reads both at call time: the Hub (whoami) and the Endpoints API roots.
        monkeypatch.setattr(constants, "ENDPOINT", fake.url)
        monkeypatch.setattr(constants, "INFERENCE_ENDPOINTS_ENDPOINT", fake.url + "/v2")
        yield fake


@pytest_asyncio.fixture
async def make_backend(api: FakeEndpointsAPI) -> AsyncIterator[MakeBackend]:
    built: list[EndpointsBackend] = []

    async def make(name: str = "ep", **options: Any) -> EndpointsBackend:
        options.setdefault("token", TOKEN)
        options.setdefault("poll_interval", 0.02)
        options.setdefault("wait_timeout", 10.0)
        backend = await ab.acreate_backend("endpoints", name=name, **options)
        assert isinstance(backend, EndpointsBackend)
        built.append(backend)
        return backend

    yield make
    for backend in built:
        await backend.aclose()


def fast_retry(attempts: int = 6) -> ab.RetryPolicy:
    return ab.RetryPolicy(max_attempts=attempts, initial_delay=0.01, max_delay=0.05)
