"""The adapter contract suite against the endpoints adapter: the Endpoints API look-alike in front of the TGI
look-alike, with huggingface_hub pointed at it. Both serve on the shared loop (the suite's tests are sync)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing.contract import BackendContract
from asyncbackends.testing.fake_endpoints import FakeEndpointsAPI
from asyncbackends.testing.fake_tgi import FakeTGIServer
from asyncbackends.testing.fake_tgi_model import FakeModel

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

    # Genuine adapter defects the contract now catches (issue 14, items 4 and 5, fixed by the core helper's
    # branch); not strict, so the fix landing turns these into passes without touching this file.
    @pytest.mark.xfail(
        reason="HTTP adapters: a request in flight at aclose() fails as a retryable BackendUnavailableError "
        "(its aiohttp session is closed under it) instead of BackendClosedError: issue 14 item 5",
        strict=False,
    )
    def test_aclose_ends_requests_in_flight(self, make_backend: Any, prompts: Sequence[str]) -> None:
        super().test_aclose_ends_requests_in_flight(make_backend, prompts)

    @pytest.mark.xfail(
        reason="HTTP adapters: the wait for a pooled connection (max_connections) counts toward gather's "
        "per-attempt timeout; the transport must take its slot with held_slot: issue 14 item 4",
        strict=False,
    )
    def test_timeout_excludes_waiting_for_a_slot(
        self, make_slot_limited_backend: Any, prompts: Sequence[str]
    ) -> None:
        super().test_timeout_excludes_waiting_for_a_slot(make_slot_limited_backend, prompts)
