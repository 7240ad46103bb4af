"""Pools intersect the replicas' images and tools, and refuse what the intersection lacks before routing."""

from __future__ import annotations

import asyncbackends as ab
from asyncbackends.adapters.mock import MockBackend

PNG = ab.image_part(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c63f8cfc0f00f0004"
        "8501808a98cc210000000049454e44ae426082"
    )
)
ADD = ab.Tool("add", "", {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})


def test_pool_claims_images_and_tools_only_where_every_replica_does() -> None:
    no_images, no_tools = MockBackend(images=False), MockBackend(tools=False)
    backend = ab.pool([no_images, no_tools])
    assert not backend.capabilities.images and not backend.capabilities.tools
    both = ab.pool([MockBackend(), MockBackend()])
    assert both.capabilities.images and both.capabilities.tools
    requests = [
        ab.GenerationRequest([{"role": "user", "content": [PNG]}], request_id="image"),
        ab.GenerationRequest(
            [{"role": "user", "content": "x"}], tools=[ADD], tool_choice="add", request_id="tools"
        ),
    ]
    results = ab.run_batch(backend, requests, return_exceptions=True)
    assert [type(r) for r in results] == [ab.RequestRejectedError, ab.RequestRejectedError]
    assert "images" in str(results[0]) and "tools" in str(results[1])
    assert sum(no_images.attempts.values()) + sum(no_tools.attempts.values()) == 0  # refused by the pool
    (called,) = ab.run_batch(both, [requests[1]])
    assert called.completions[0].tool_calls[0].name == "add"
    backend.close()
    both.close()
