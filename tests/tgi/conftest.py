"""Fixtures for the tgi adapter: a look-alike server per test on the test's loop, and backends on it.

Every server checks each request and response it exchanges against TGI's OpenAPI spec; a test fails at
teardown if any exchange broke it (tests that send invalid requests on purpose opt out of the request side).
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_asyncio

import asyncbackends as ab
from asyncbackends.adapters.tgi import TGIBackend
from asyncbackends.testing.fake_tgi import FakeTGIServer

TOKEN = "hf_TESTsecret_0123456789abcdef"

MakeServer = Callable[..., Awaitable[FakeTGIServer]]
MakeBackend = Callable[..., Awaitable[TGIBackend]]


@pytest_asyncio.fixture
async def make_server() -> AsyncIterator[MakeServer]:
    servers: list[FakeTGIServer] = []

    async def make(**options: Any) -> FakeTGIServer:
        server = await FakeTGIServer(**options).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()
    violations = [
        v for s in servers for v in s.schema_violations if not getattr(s, "allow_bad_requests", False)
    ]
    assert violations == [], "exchanges broke TGI's OpenAPI spec"


@pytest_asyncio.fixture
async def server(make_server: MakeServer) -> FakeTGIServer:
    return await make_server()


@pytest_asyncio.fixture
async def make_backend() -> AsyncIterator[MakeBackend]:
    built: list[TGIBackend] = []

    async def make(url: str, **options: Any) -> TGIBackend:
        options.setdefault("token", TOKEN)
        backend = await ab.acreate_backend("tgi", url=url, **options)
        assert isinstance(backend, TGIBackend)
        built.append(backend)
        return backend

    yield make
    for backend in built:
        await backend.aclose()


@pytest_asyncio.fixture
async def backend(server: FakeTGIServer, make_backend: MakeBackend) -> TGIBackend:
    return await make_backend(server.url)


def fast_retry(attempts: int = 4) -> ab.RetryPolicy:
    return ab.RetryPolicy(max_attempts=attempts, initial_delay=0.001, max_delay=0.01)


def sent(server: FakeTGIServer, path: str = "/generate_stream") -> list[Any]:
    """The bodies the server received on ``path``, in arrival order."""
    return [body for p, body in server.received if p == path]


def png(size: int = 2) -> bytes:
    """A small red PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), "red").save(buffer, format="PNG")
    return buffer.getvalue()


def noise_png(side: int) -> bytes:
    """A PNG of random pixels, which do not compress: about ``side * side * 3`` bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(buffer, format="PNG")
    return buffer.getvalue()


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for a state the test needs, a counter the server keeps (a safety timeout, not a timing guess)."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110  (the state is a counter, not an event)
            await asyncio.sleep(0.005)
