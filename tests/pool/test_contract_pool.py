"""The adapter contract suite against a pool of two TGI look-alikes.

The look-alikes serve on the shared loop here (the suite's tests are sync), beside the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

import asyncbackends as ab
from asyncbackends.testing._fake_tgi.model import FakeModel
from asyncbackends.testing.contract import BackendContract
from asyncbackends.testing.fake_tgi import FakeTGIServer

SECRET = "hf_poolSECRET_0123456789"


def _pool(urls: Sequence[str], **options: object) -> ab.AsyncBackend:
    replicas = [{"backend": "tgi", "url": url, "token": SECRET} for url in urls]
    return ab.create_backend("pool", replicas=replicas, **options)


class TestPoolContract(BackendContract):
    cancel_after = 0.02  # the look-alikes' latency keeps every request in flight at least 50 ms

    @pytest.fixture(scope="class")
    @classmethod
    def servers(cls) -> Iterator[list[FakeTGIServer]]:
        manager = ab.get_loop_manager()
        servers = [
            manager.run(FakeTGIServer(latency=0.05, check_schema=False, record=False).start())
            for _ in range(2)
        ]
        yield servers
        for server in servers:
            manager.run(server.stop())

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, servers: list[FakeTGIServer]) -> Iterator[ab.AsyncBackend]:
        backend = _pool([s.url for s in servers])
        yield backend
        ab.get_loop_manager().run(backend.aclose())

    @pytest.fixture
    def make_backend(self, servers: list[FakeTGIServer]) -> Callable[[], ab.AsyncBackend]:
        return lambda: _pool([s.url for s in servers])

    @pytest.fixture
    def failing_backend(self) -> Callable[[], ab.AsyncBackend]:
        # Nothing listens on port 9: both replicas refuse, are cooled down, and a request gives up at once.
        return lambda: _pool(["http://127.0.0.1:9", "http://localhost:9"], wait=0.05)

    @pytest.fixture
    def rejected_requests(self) -> list[ab.GenerationRequest]:
        # The look-alikes limit inputs to 1024 tokens: a 422 from whichever replica, never retried.
        return [ab.GenerationRequest("x" * 5000, ab.SamplingParams(max_tokens=4), request_id="too-long")]

    @pytest.fixture
    def secret(self) -> str:
        return SECRET

    @pytest.fixture
    def decode(self) -> Callable[[Sequence[int]], str]:
        return lambda ids: "".join(FakeModel.token_text(i) for i in ids)
