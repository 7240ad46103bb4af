"""The adapter contract suite against the endpoints adapter: the Endpoints API look-alike in front of the TGI
look-alike, with huggingface_hub pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import asyncbackends as ab
from asyncbackends.testing.fake_endpoints import FakeEndpointsAPI

from ..lookalike_contract import LookAlikeContract, start_lookalike, stop_lookalike

SECRET = "hf_ENDPOINTScontract_0123456789"


class TestEndpointsContract(LookAlikeContract):
    SECRET = SECRET

    @pytest.fixture(scope="class")
    @classmethod
    def api(cls) -> Iterator[FakeEndpointsAPI]:
        from huggingface_hub import constants

        manager = ab.get_loop_manager()
        tgi = start_lookalike()
        api = manager.run(FakeEndpointsAPI(upstream=tgi.url, token=SECRET).__aenter__())
        api.add("contract-ep")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(constants, "ENDPOINT", api.url)
            patch.setattr(constants, "INFERENCE_ENDPOINTS_ENDPOINT", api.url + "/v2")
            yield api
        manager.run(api.__aexit__(None, None, None))
        stop_lookalike(tgi)

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
