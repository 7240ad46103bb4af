"""The adapter contract suite against the tgi adapter and the TGI look-alike."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import asyncbackends as ab
from asyncbackends.testing.fake_tgi import FakeTGIServer

from ..lookalike_contract import LookAlikeContract, start_lookalike, stop_lookalike

SECRET = "hf_contractSECRET_0123456789"


class TestTGIContract(LookAlikeContract):
    SECRET = SECRET

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls) -> Iterator[FakeTGIServer]:
        server = start_lookalike()
        yield server
        stop_lookalike(server)

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, server: FakeTGIServer) -> Iterator[ab.AsyncBackend]:
        backend = ab.create_backend("tgi", url=server.url, token=SECRET)
        yield backend
        ab.get_loop_manager().run(backend.aclose())

    @pytest.fixture
    def make_backend(self, server: FakeTGIServer) -> Callable[[], ab.AsyncBackend]:
        return lambda: ab.create_backend("tgi", url=server.url, token=SECRET)

    @pytest.fixture
    def make_slot_limited_backend(self, server: FakeTGIServer) -> Callable[[int], ab.AsyncBackend]:
        return lambda limit: ab.create_backend("tgi", url=server.url, token=SECRET, max_connections=limit)

    @pytest.fixture
    def failing_backend(self) -> Callable[[], ab.AsyncBackend]:
        # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
        return lambda: ab.create_backend("tgi", url="http://127.0.0.1:9", token=False)
