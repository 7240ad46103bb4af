"""The adapter contract suite against the endpoints adapter: the Endpoints API look-alike in front of the TGI
look-alike, with huggingface_hub pointed at it. Both serve on the shared loop (the suite's tests are sync)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

import asyncbackends as ab
from asyncbackends.testing._fake_tgi.model import FakeModel
from asyncbackends.testing.contract import BackendContract
from asyncbackends.testing.fake_endpoints import FakeEndpointsAPI
from asyncbackends.testing.fake_tgi import FakeTGIServer

SECRET = "hf_ENDPOINTScontract_0123456789"


class TestEndpointsContract(BackendContract):
    cancel_after = 0.02  # the upstream look-alike's latency keeps every request in flight 50 ms

    @pytest.fixture(scope="class")
    @classmethod
    def api(cls) -> Iterator[FakeEndpointsAPI]:
        from huggingface_hub import constants

        manager = ab.get_loop_manager()
        tgi = manager.run(FakeTGIServer(latency=0.05, check_schema=False, record=False).start())
        api = manager.run(FakeEndpointsAPI(upstream=tgi.url, token=SECRET).__aenter__())
        api.add("contract-ep")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(constants, "ENDPOINT", api.url)
            patch.setattr(constants, "INFERENCE_ENDPOINTS_ENDPOINT", api.url + "/v2")
            yield api
        manager.run(api.__aexit__(None, None, None))
        manager.run(tgi.stop())

    def _build(self, name: str = "contract-ep") -> ab.AsyncBackend:
        return ab.create_backend("endpoints", name=name, token=SECRET, poll_interval=0.02, wait_timeout=10.0)

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, api: FakeEndpointsAPI) -> Iterator[ab.AsyncBackend]:
        backend = ab.create_backend("endpoints", name="contract-ep", token=SECRET, poll_interval=0.02)
        yield backend
        ab.get_loop_manager().run(backend.aclose())

    @pytest.fixture
    def make_backend(self, api: FakeEndpointsAPI) -> Callable[[], ab.AsyncBackend]:
        return self._build

    @pytest.fixture
    def make_slot_limited_backend(self, api: FakeEndpointsAPI) -> Callable[[int], ab.AsyncBackend]:
        return lambda limit: ab.create_backend(
            "endpoints", name="contract-ep", token=SECRET, poll_interval=0.02, max_connections=limit
        )

    @pytest.fixture
    def rejected_requests(self) -> list[ab.GenerationRequest]:
        return [ab.GenerationRequest("x" * 5000, ab.SamplingParams(max_tokens=4), request_id="too-long")]

    @pytest.fixture
    def secret(self) -> str:
        return SECRET

    @pytest.fixture
    def decode(self) -> Callable[[Sequence[int]], str]:
        return lambda ids: "".join(FakeModel.token_text(i) for i in ids)
