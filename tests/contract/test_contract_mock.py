"""The contract suite against the reference `mock` adapter: every applicable contract holds."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

import asyncbackends as ab
from asyncbackends.testing.contract import BackendContract


class TestMockContract(BackendContract):
    cancel_after = 0.005  # the mock's latency below keeps every request in flight at least this long

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls) -> Iterator[ab.AsyncBackend]:
        backend = ab.create_backend("mock", latency=0.02)
        yield backend
        ab.get_loop_manager().run(backend.aclose())

    @pytest.fixture
    def make_backend(self) -> Callable[[], ab.AsyncBackend]:
        # Latency keeps requests in flight long enough for the aclose() checks to catch them there.
        return lambda: ab.create_backend("mock", latency=0.2)

    @pytest.fixture
    def failing_backend(self) -> Callable[[], ab.AsyncBackend]:
        return lambda: ab.create_backend("mock", failure_rate=1.0, failure="unavailable")

    @pytest.fixture
    def decode(self) -> Callable[[Sequence[int]], str]:
        return lambda ids: "".join(map(chr, ids))
