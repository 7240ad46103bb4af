"""The contract suite against the ``ray`` backend hosting the mock in two actors of the session's cluster."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing.contract import BackendContract

from .conftest import make_ray_backend

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.usefixtures("ray_cluster")]


class TestRayContract(BackendContract):
    cancel_after = 0.05  # a request reaches its actor well within this; the mock's latency outlasts it

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, ray_cluster: Any) -> Iterator[ab.AsyncBackend]:
        backend = make_ray_backend(replicas=2, options={"latency": 0.3})
        yield backend
        backend.close()

    @pytest.fixture
    def make_backend(self) -> Callable[[], ab.AsyncBackend]:
        return lambda: make_ray_backend(replicas=1)

    @pytest.fixture
    def failing_backend(self) -> Callable[[], ab.AsyncBackend]:
        # Its one replica never becomes healthy: the router waits `wait` seconds for it, then fails.
        options = {"failure_rate": 1.0, "failure": "unavailable"}
        return lambda: make_ray_backend(replicas=1, options=options, router_options={"wait": 2})

    @pytest.fixture
    def decode(self) -> Callable[[Sequence[int]], str]:
        return lambda ids: "".join(map(chr, ids))
