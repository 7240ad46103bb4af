"""An opt-in pytest plugin: build the backend under test from the command line.

Enable it with ``pytest_plugins = ["asyncbackends.testing.plugin"]`` in your top-level ``conftest.py`` or
``pytest -p asyncbackends.testing.plugin``. It imports no engine: the backend is built, by name through the
registry, only when a test asks for it.

Options:
    ``--backend-name NAME``: the registered adapter (or ``"module:Class"``) to build.
    ``--backend-option KEY=VALUE``: an adapter option, repeatable; values read by `parse_option_value`.
    ``--no-fresh-backends``: do not build extra backends for the checks that close one (expensive engines).

Fixtures (session scoped): ``backend_name``, ``backend_options``, ``registered_backend`` (built once, closed
at the end), ``make_registered_backend`` (a factory for fresh ones, or ``None``), ``backend_secret`` (the
value of an option whose name says it is a credential: token, key, secret, password).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from .._parse import parse_option_value, parse_options
from ..errors import InvalidRequestError
from ..registry import create_backend

__all__ = ["CONTRACT_TARGET", "parse_backend_options", "parse_option_value"]

CONTRACT_TARGET = pytest.StashKey[tuple[str, Mapping[str, Any]]]()
"""Where `run_contract` hands the plugin a name and already-typed options, bypassing the command line."""

_SECRET_WORDS = ("token", "key", "secret", "password")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--backend-*`` options."""
    group = parser.getgroup("asyncbackends", "asyncbackends adapter under test")
    group.addoption("--backend-name", default=None, metavar="NAME", help="registered adapter to test")
    group.addoption(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="adapter option (repeatable); JSON values are decoded",
    )
    group.addoption(
        "--no-fresh-backends",
        action="store_true",
        default=False,
        help="skip the checks that build and close extra backends",
    )


def parse_backend_options(pairs: list[str]) -> dict[str, Any]:
    """``["key=value", ...]`` to a dict of options.

    Raises:
        pytest.UsageError: An item is not ``key=value``.
    """
    try:
        return parse_options(pairs, flag="--backend-option")
    except InvalidRequestError as exc:
        raise pytest.UsageError(str(exc)) from None


def _target(config: pytest.Config) -> tuple[str | None, Mapping[str, Any]]:
    if CONTRACT_TARGET in config.stash:
        return config.stash[CONTRACT_TARGET]
    return config.getoption("backend_name"), parse_backend_options(config.getoption("backend_option"))


@pytest.fixture(scope="session")
def backend_name(pytestconfig: pytest.Config) -> str:
    """The adapter name given with ``--backend-name``; tests needing it skip when there is none."""
    name = _target(pytestconfig)[0]
    if not name:
        pytest.skip("no --backend-name given")
    return name


@pytest.fixture(scope="session")
def backend_options(pytestconfig: pytest.Config) -> dict[str, Any]:
    """The adapter options given with ``--backend-option``."""
    return dict(_target(pytestconfig)[1])


@pytest.fixture(scope="session")
def backend_secret(backend_options: dict[str, Any]) -> str | None:
    """The first option value whose name marks it as a credential, for the no-secret-in-repr check."""
    for key, value in backend_options.items():
        if any(word in key.lower() for word in _SECRET_WORDS) and isinstance(value, str) and value:
            return value
    return None


@pytest.fixture(scope="session")
def registered_backend(backend_name: str, backend_options: dict[str, Any]) -> Iterator[Any]:
    """The backend built once from the command line, shared by the session and closed at its end."""
    backend = create_backend(backend_name, **backend_options)
    yield backend
    from ..loop import get_loop_manager

    get_loop_manager().run(backend.aclose())


@pytest.fixture(scope="session")
def make_registered_backend(
    pytestconfig: pytest.Config, backend_name: str, backend_options: dict[str, Any]
) -> Iterator[Callable[[], Any] | None]:
    """Fresh backends like `registered_backend` (closed at the end); ``None`` with ``--no-fresh-backends``."""
    if pytestconfig.getoption("no_fresh_backends"):
        yield None
        return
    built: list[Any] = []

    def make() -> Any:
        backend = create_backend(backend_name, **backend_options)
        built.append(backend)
        return backend

    yield make
    from ..loop import get_loop_manager

    for backend in built:
        get_loop_manager().run(backend.aclose())
