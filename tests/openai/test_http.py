"""The openai adapter's HTTP side without an engine: cache identity, closing, credentials, connection waits."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

import asyncbackends as ab
from asyncbackends._cache import backend_fingerprint
from asyncbackends.adapters.openai import OpenAIBackend
from asyncbackends.testing._serve import serve

from .conftest import until


class Server:
    """``/v1/models`` lists ``models``; ``/v1/completions`` answers after ``latency`` s, or never if ``hang``."""

    def __init__(self) -> None:
        self.models: list[dict[str, Any]] = [
            {"id": "m1", "object": "model", "owned_by": "vllm", "root": "acme/a"}
        ]
        self.latency = 0.0
        self.hang = False
        self.in_flight = 0
        self.max_in_flight = 0
        self.completions = 0
        self.headers: list[dict[str, str]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()

    async def start(self) -> Server:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        self._runner, port = await serve(app)
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        return web.json_response({"object": "list", "data": self.models})

    async def _completions(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        self.completions += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hang:
                await self._release.wait()
            await asyncio.sleep(self.latency)
        finally:
            self.in_flight -= 1
        body = await request.json()
        choices = [{"index": i, "text": "ok", "finish_reason": "length"} for i in range(body.get("n", 1))]
        return web.json_response({"model": "m1", "choices": choices, "usage": {"prompt_tokens": 1}})


@pytest_asyncio.fixture
async def server() -> AsyncIterator[Server]:
    running = await Server().start()
    yield running
    await running.stop()


async def build(url: str, **options: Any) -> OpenAIBackend:
    backend = await ab.acreate_backend("openai", base_url=url, **options)
    assert isinstance(backend, OpenAIBackend)
    return backend


@pytest.mark.asyncio
async def test_fingerprint_holds_the_model_the_name_points_at(server: Server) -> None:
    first = await build(server.url, api_key="sk-x")
    server.models[0]["root"] = "acme/b"  # redeployed: same served name, other weights
    second = await build(server.url, api_key="sk-x")
    try:
        assert backend_fingerprint(first)["model_root"] == "acme/a"
        assert backend_fingerprint(second)["model_root"] == "acme/b"
        assert backend_fingerprint(first) != backend_fingerprint(second)
    finally:
        await first.aclose()
        await second.aclose()


@pytest.mark.asyncio
async def test_requests_in_flight_during_aclose_end_closed(server: Server) -> None:
    server.hang = True
    backend = await build(server.url, api_key="sk-x")
    run = asyncio.ensure_future(
        ab.gather(
            backend,
            [ab.GenerationRequest(f"p{i}") for i in range(5)],
            concurrency=5,
            retry=ab.RetryPolicy(max_attempts=1),  # what each request ended with, not what a retry met
            return_exceptions=True,
        )
    )
    await until(lambda: server.in_flight == 5)
    await ab.get_loop_manager().arun(backend.aclose())
    outcomes = await run
    assert all(isinstance(o, ab.BackendClosedError) and not o.retryable for o in outcomes), outcomes
    assert server.completions == 5 and backend._http._session is None


@pytest.mark.asyncio
async def test_waiting_for_a_connection_is_not_timed(server: Server) -> None:
    # 16 requests of 0.3 s through 2 connections: the last pair waits 2.1 s for a connection, longer than
    # the 1.2 s per-attempt timeout, which still leaves a loaded machine 0.9 s more for one exchange.
    server.latency = 0.3
    backend = await build(server.url, api_key="sk-x", max_connections=2)
    try:
        outcomes = await ab.gather(
            backend,
            [ab.GenerationRequest(f"p{i}") for i in range(16)],
            concurrency=16,
            timeout=1.2,
            retry=ab.RetryPolicy(max_attempts=1),
            return_exceptions=True,
        )
    finally:
        await backend.aclose()
    assert all(isinstance(o, ab.GenerationResult) for o in outcomes), outcomes
    assert server.max_in_flight == 2


@pytest.mark.asyncio
async def test_credentials_in_headers_and_url_are_sent_and_masked(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = server.url.replace("http://", "http://dave:pw-SECRET@")
    backend = await build(url, api_key="", headers={"api-key": "key-SECRET", "X-Plain": "visible"})
    try:
        outcomes = await ab.gather(backend, [ab.GenerationRequest("x")])
        dead = await build(url.replace(server.url.split(":")[2].split("/")[0], "9"), model="m1", api_key="")
        errors = await ab.gather(
            dead, [ab.GenerationRequest("x")], retry=ab.RetryPolicy(max_attempts=1), return_exceptions=True
        )
        await dead.aclose()
    finally:
        await backend.aclose()
    seen = server.headers[-1]
    assert seen["api-key"] == "key-SECRET" and seen["X-Plain"] == "visible"
    assert seen["Authorization"] == "Basic " + base64.b64encode(b"dave:pw-SECRET").decode()
    assert backend.base_url == server.url and isinstance(errors[0], ab.BackendUnavailableError)
    views = [repr(backend), repr(vars(backend)), repr(vars(backend._http)), caplog.text, repr(vars(dead))]
    views += [json.dumps(backend_fingerprint(backend)), *(f"{o!s} {o!r}" for o in [*outcomes, *errors])]
    assert "SECRET" not in "\n".join(views)
