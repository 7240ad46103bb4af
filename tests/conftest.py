"""Shared fixtures: a fresh `mock` backend per test, built on the shared loop like any user's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.mock import MockBackend


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
