"""Cache keys: a TGI backend is keyed by the model its server serves, learned before the first request."""

from __future__ import annotations

from pathlib import Path

import pytest

import asyncbackends as ab
from asyncbackends._cache import backend_fingerprint

from .conftest import MakeBackend, MakeServer


@pytest.mark.asyncio
async def test_a_server_redeployed_with_another_model_gets_other_cache_keys(
    make_server: MakeServer, make_backend: MakeBackend, tmp_path: Path
) -> None:
    server = await make_server(model_id="acme/model-a", model_sha="aaa111")
    first = await make_backend(server.url)
    before = backend_fingerprint(first)
    assert before["model_id"] == "acme/model-a" and before["model_sha"] == "aaa111"
    request = ab.GenerationRequest("same prompt", ab.SamplingParams(max_tokens=4))
    cache = tmp_path / "cache.sqlite"
    await ab.gather(first, [request], cache=cache)
    assert server.paths["/generate_stream"] == 1

    server.model_id, server.model_sha = "acme/model-b", "bbb222"  # redeployed at the same URL
    second = await make_backend(server.url)
    assert backend_fingerprint(second) != before
    assert backend_fingerprint(second)["model_id"] == "acme/model-b"
    await ab.gather(second, [request], cache=cache)
    assert server.paths["/generate_stream"] == 2  # asked again, not served model A's answer

    third = await make_backend(server.url)  # the same model again: the cache answers
    await ab.gather(third, [request], cache=cache)
    assert server.paths["/generate_stream"] == 2


@pytest.mark.asyncio
async def test_the_model_is_learned_when_the_backend_is_built(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(model_id="acme/model-a")
    backend = await make_backend(server.url)
    assert server.paths["/info"] == 1 and server.paths["/generate_stream"] == 0
    assert backend_fingerprint(backend)["model_id"] == "acme/model-a"


@pytest.mark.asyncio
async def test_an_unreachable_server_at_build_is_keyed_apart_until_it_answers(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(model_id="acme/model-a")
    url = server.url
    await server.stop()
    one, two = await make_backend(url), await make_backend(url)
    assert backend_fingerprint(one) != backend_fingerprint(two)  # nothing cached can match either
    assert backend_fingerprint(one)["model_id"] is None
    revived = await make_server(model_id="acme/model-a", port=int(url.rsplit(":", 1)[1]))
    await ab.gather(one, [ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=2))])
    assert revived.paths["/info"] == 1
    assert backend_fingerprint(one) == {
        "name": "tgi",
        "url": url,
        "model_id": "acme/model-a",
        "model_sha": None,
        "model_dtype": None,
    }


@pytest.mark.asyncio
async def test_a_refused_token_fails_the_build(make_server: MakeServer) -> None:
    from aiohttp import web

    from asyncbackends.testing._serve import serve

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": "Authorization header is invalid"}, status=401)

    app = web.Application()
    app.router.add_get("/info", refuse)
    runner, port = await serve(app)
    try:
        with pytest.raises(ab.AuthenticationError):
            await ab.acreate_backend("tgi", url=f"http://127.0.0.1:{port}", token="hf_wrong")
    finally:
        await runner.cleanup()
