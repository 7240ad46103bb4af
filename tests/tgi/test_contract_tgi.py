"""The adapter contract suite against the tgi adapter and the TGI look-alike.

The look-alike serves on the shared loop here (the suite's tests are sync), beside the adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

import asyncbackends as ab
from asyncbackends.testing._fake_tgi.model import FakeModel
from asyncbackends.testing.contract import BackendContract
from asyncbackends.testing.fake_tgi import FakeTGIServer

SECRET = "hf_contractSECRET_0123456789"


class TestTGIContract(BackendContract):
    cancel_after = 0.02  # the look-alike's latency keeps every request in flight at least 50 ms

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls) -> Iterator[FakeTGIServer]:
        manager = ab.get_loop_manager()
        server = manager.run(FakeTGIServer(latency=0.05, check_schema=False, record=False).start())
        yield server
        manager.run(server.stop())

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

    @pytest.fixture
    def rejected_requests(self) -> list[ab.GenerationRequest]:
        # The look-alike's router limits inputs to 1024 tokens: TGI answers 422, never retried.
        return [ab.GenerationRequest("x" * 5000, ab.SamplingParams(max_tokens=4), request_id="too-long")]

    @pytest.fixture
    def secret(self) -> str:
        return SECRET

    @pytest.fixture
    def decode(self) -> Callable[[Sequence[int]], str]:
        return lambda ids: "".join(FakeModel.token_text(i) for i in ids)
