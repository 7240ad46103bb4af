"""The contract suite subclassed for each broken adapter (run by test_contract_broken.py, not collected).

Also holds the override-guard cases: a test overridden without an expected-failure mark, one deleted, and
one overridden the allowed way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import pytest

import asyncbackends as ab
from asyncbackends.testing.contract import BackendContract

SECRET = "sk-broken-secret-0123"


class _Broken(BackendContract):
    target: ClassVar[str] = "mock"
    options: ClassVar[dict[str, Any]] = {}

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls) -> Iterator[ab.AsyncBackend]:
        backend = ab.create_backend(cls.target, **cls.options)
        yield backend
        ab.get_loop_manager().run(backend.aclose())

    @pytest.fixture
    def make_backend(self) -> Callable[[], ab.AsyncBackend]:
        return lambda: ab.create_backend(self.target, **self.options)

    @pytest.fixture
    def decode(self) -> Callable[[Sequence[int]], str]:
        return lambda ids: "".join(map(chr, ids))


class TestSwapped(_Broken):
    target = "broken_adapters:SwappedBackend"


class TestNIgnored(_Broken):
    target = "broken_adapters:NIgnoredBackend"


class TestSwallowedCancel(_Broken):
    target = "broken_adapters:SwallowedCancelBackend"
    cancel_after = 0.05


class TestSecretInRepr(_Broken):
    target = "broken_adapters:SecretInReprBackend"
    options: ClassVar[dict[str, Any]] = {"api_key": SECRET}

    @pytest.fixture
    def secret(self) -> str:
        return SECRET


class TestRawErrors(_Broken):
    target = "broken_adapters:RawErrorBackend"

    @pytest.fixture
    def failing_backend(self) -> Callable[[], ab.AsyncBackend]:
        return lambda: ab.create_backend(self.target, offline=True)

    @pytest.fixture
    def rejected_requests(self) -> list[ab.GenerationRequest]:
        return [ab.GenerationRequest("x" * 2000, request_id="too-long")]


class TestPrivateLoop(_Broken):
    target = "broken_adapters:PrivateLoopBackend"


class TestIgnoresClose(_Broken):
    target = "broken_adapters:IgnoresCloseBackend"


class TestStopIgnored(_Broken):
    target = "broken_adapters:StopIgnoredBackend"


class TestPositiveScore(_Broken):
    target = "broken_adapters:PositiveScoreBackend"


class TestBlocking(_Broken):
    target = "broken_adapters:BlockingBackend"


class TestRepeatedSample(_Broken):
    target = "broken_adapters:RepeatedSampleBackend"


class TestSeededCopies(_Broken):
    target = "broken_adapters:SeededCopiesBackend"


class TestSecretInError(_Broken):
    target = "broken_adapters:SecretInErrorBackend"
    options: ClassVar[dict[str, Any]] = {"api_key": SECRET}

    @pytest.fixture
    def secret(self) -> str:
        return SECRET

    @pytest.fixture
    def failing_backend(self) -> Callable[[], ab.AsyncBackend]:
        return lambda: ab.create_backend(self.target, api_key=SECRET, offline=True)

    @pytest.fixture
    def rejected_requests(self) -> list[ab.GenerationRequest]:
        return [ab.GenerationRequest("x" * 2000, request_id="too-long")]


class TestPlainCredentials(_Broken):
    # No secret fixture: the walk finds credential-shaped state by itself.
    target = "broken_adapters:PlainCredentialsBackend"
    options: ClassVar[dict[str, Any]] = {"api_key": SECRET, "url": "http://user:pa55word@127.0.0.1:9"}


class TestResultsAfterClose(_Broken):
    target = "broken_adapters:ResultsAfterCloseBackend"


class TestRetryableAtClose(_Broken):
    target = "broken_adapters:RetryableAtCloseBackend"


class TestClosingCorrectly(_Broken):
    """A correct adapter at close: must pass every contract, the in-flight one included."""

    target = "broken_adapters:ClosingMock"


class _SlotLimited(_Broken):
    @pytest.fixture
    def make_slot_limited_backend(self) -> Callable[[int], ab.AsyncBackend]:
        return lambda limit: ab.create_backend(self.target, max_slots=limit, latency=0.05)


class TestQueued(_SlotLimited):
    target = "broken_adapters:QueuedBackend"


class TestHeldSlot(_SlotLimited):
    """A correct adapter with slots of its own: must pass every contract, the timeout one included."""

    target = "broken_adapters:HeldSlotBackend"


class TestPinnedToVersion1(_Broken):
    """Copies one sample n times, but pins the suite at version 1, before that contract was added."""

    target = "broken_adapters:RepeatedSampleBackend"
    contract_version = 1


class TestOverrides(_Broken):
    """A correct backend, but the suite was tampered with."""

    def test_greedy_deterministic(self, backend: ab.AsyncBackend, prompts: Sequence[str]) -> None:
        pass

    test_stop_respected = None  # type: ignore[assignment]

    @pytest.mark.xfail(reason="demonstrates the allowed way to override", strict=True)
    def test_chat_prompt(self, backend: ab.AsyncBackend, prompts: Sequence[str]) -> None:
        raise AssertionError("expected to fail")
