"""Images and tools reach an Inference Endpoint through its inner client (TGI's Messages API here)."""

from __future__ import annotations

import pytest

import asyncbackends as ab
from asyncbackends.testing.fake_endpoints import FakeEndpointsAPI
from asyncbackends.testing.fake_tgi import FakeTGIServer

from .conftest import MakeBackend

ADD = ab.Tool("add", "", {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})
PNG_URL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@pytest.mark.asyncio
async def test_images_and_tools_go_through_the_inner_client(
    api: FakeEndpointsAPI, tgi: FakeTGIServer, make_backend: MakeBackend
) -> None:
    endpoint = api.add("ep")
    backend = await make_backend()
    assert backend.capabilities.images and backend.capabilities.tools  # the inner client's
    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    requests = [
        ab.GenerationRequest([{"role": "user", "content": [image]}], ab.SamplingParams(max_tokens=2)),
        ab.GenerationRequest([{"role": "user", "content": "x"}], tools=[ADD], tool_choice="add"),
    ]
    seen, called = await ab.gather(backend, requests)
    assert seen.text and called.completions[0].tool_calls[0].name == "add"
    chats = [body for path, body in tgi.received if path == "/v1/chat/completions"]
    assert chats[0]["messages"][0]["content"] == [image] and chats[1]["tool_choice"] == {
        "function": {"name": "add"}
    }
    assert tgi.schema_violations == [] and "/v1/chat/completions" in endpoint.proxied


@pytest.mark.asyncio
async def test_unclaimed_tools_are_refused_before_the_endpoint_is_asked(
    api: FakeEndpointsAPI, tgi: FakeTGIServer, make_backend: MakeBackend
) -> None:
    api.add("ep")
    backend = await make_backend()
    backend.capabilities = ab.Capabilities(chat=True)  # as for a deployment without tools
    before = len(tgi.received)
    request = ab.GenerationRequest([{"role": "user", "content": "x"}], tools=[ADD])
    with pytest.raises(ab.RequestRejectedError, match="tools"):
        await ab.gather(backend, [request])
    assert len(tgi.received) == before
