"""LoRA adapters through the ``ray`` backend: its router keeps an adapter's requests on the replica holding it."""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab

from .conftest import make_ray_backend

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.usefixtures("ray_cluster")]


def test_an_adapters_requests_stay_on_the_replica_that_holds_it(ray_cluster: Any) -> None:
    backend = make_ray_backend(replicas=2, options={"adapters": ["a", "b"]}, router_options={"seed": 0})
    try:
        assert backend.capabilities.adapters
        # One at a time: under least-loaded routing alone every request would be a tie, drawn at random.
        requests = [ab.GenerationRequest(f"q{i}", adapter="a", request_id=f"a{i}") for i in range(8)]
        results = ab.run_batch(ab.with_adapter(backend, "a"), requests, concurrency=1)
        assert [r.text for r in results] == [f"[a] q{i}" for i in range(8)]  # type: ignore[union-attr]
        assert sorted(s.requests for s in backend.replica_stats()) == [0, 8]
        base = [ab.GenerationRequest(f"q{i}", request_id=f"base{i}") for i in range(8)]
        ab.run_batch(backend, base, concurrency=4)
        assert all(s.requests > 0 for s in backend.replica_stats())  # the base spreads by load
    finally:
        backend.close()
