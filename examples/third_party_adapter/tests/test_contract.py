"""How an adapter author checks an adapter: subclass the contract, override the fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import asyncbackends as ab
from asyncbackends.testing.contract import BackendContract

SECRET = "sk-reverse-echo-test-key"


class TestReverseEcho(BackendContract):
    cancel_after = 0.02  # a 256-token request takes about 0.5 s here

    # Wider-scoped fixtures are classmethods (pytest 9 deprecates them as instance methods).
    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls) -> Iterator[ab.AsyncBackend]:
        backend = ab.create_backend("reverse-echo", api_key=SECRET)
        yield backend
        ab.get_loop_manager().run(backend.aclose())

    @pytest.fixture
    def make_backend(self):
        return lambda: ab.create_backend("reverse-echo")

    @pytest.fixture
    def rejected_requests(self):
        return [ab.GenerationRequest("x" * 5000, request_id="too-long")]

    @pytest.fixture
    def secret(self):
        return SECRET

    @pytest.fixture
    def decode(self):
        return lambda ids: "".join(map(chr, ids))
