"""The contract suite against the TGI look-alike: what the tgi, pool and endpoints contract tests share.

The look-alikes serve on the shared loop (the suite's tests are sync), beside the backend under test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import pytest

import asyncbackends as ab
from asyncbackends.testing._fake_tgi.model import FakeModel
from asyncbackends.testing.contract import BackendContract
from asyncbackends.testing.fake_tgi import FakeTGIServer


def start_lookalike() -> FakeTGIServer:
    """A look-alike whose 50 ms latency keeps every request in flight long enough to be cancelled."""
    return ab.get_loop_manager().run(FakeTGIServer(latency=0.05, check_schema=False, record=False).start())


def stop_lookalike(server: FakeTGIServer) -> None:
    """Stop a look-alike `start_lookalike` started."""
    ab.get_loop_manager().run(server.stop())


class LookAlikeContract(BackendContract):
    """`BackendContract` for a backend in front of look-alikes: a subclass names its token in ``SECRET``."""

    SECRET: ClassVar[str]
    cancel_after = 0.02  # the look-alike's latency keeps every request in flight at least 50 ms

    @pytest.fixture
    def rejected_requests(self) -> list[ab.GenerationRequest]:
        # The look-alike's router limits inputs to 1024 tokens: TGI answers 422, never retried.
        return [ab.GenerationRequest("x" * 5000, ab.SamplingParams(max_tokens=4), request_id="too-long")]

    @pytest.fixture
    def secret(self) -> str:
        return self.SECRET

    @pytest.fixture
    def decode(self) -> Callable[[Sequence[int]], str]:
        return lambda ids: "".join(FakeModel.token_text(i) for i in ids)
