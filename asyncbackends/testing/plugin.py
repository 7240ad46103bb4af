"""An opt-in pytest plugin: build the backend under test from the command line.

Enable it with ``pytest_plugins = ["asyncbackends.testing.plugin"]`` in your top-level ``conftest.py`` or
``pytest -p asyncbackends.testing.plugin``. It imports no engine: the backend is built, by name through the
registry, only when a test asks for it.

Options:
    ``--backend-name NAME``: the registered adapter (or ``"module:Class"``) to build.
    ``--backend-option KEY=VALUE``: an adapter option, repeatable; values read by `parse_option_value`.
    ``--no-fresh-backends``: do not build extra backends for the checks that close one (expensive engines).
    ``--failing-backend-option KEY=VALUE``: options (over the others) that make every request fail in the
    transport or engine, e.g. ``url=http://127.0.0.1:9``; repeatable. Enables the error-mapping checks.
    ``--slot-limit-option NAME``: the adapter option that sizes its own pool or engine slots, e.g.
    ``max_connections``. Enables the timeout-semantics check.

Fixtures (session scoped): ``backend_name``, ``backend_options``, ``registered_backend`` (built once, closed
at the end), ``make_registered_backend`` (a factory for fresh ones, or ``None``), ``backend_secret`` (the
value of an option whose name says it is a credential: token, key, secret, password),
``make_failing_registered_backend`` and ``make_slot_limited_registered_backend`` (factories, or ``None``).

Before any test, ``registered_backend`` sends one short request: a backend whose server cannot be reached
(`BackendUnavailableError`, when built or on that request) ends the session at once with exit status
`UNREACHABLE_EXIT` and "cannot reach the server", instead of failing every contract for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from .._parse import parse_option_value as parse_option_value
from .._parse import parse_options
from .._registry import create_backend
from .._types import GenerationRequest, SamplingParams
from ..errors import BackendUnavailableError, InvalidRequestError

__all__ = ["CONTRACT_EXTRAS", "CONTRACT_TARGET", "UNREACHABLE", "UNREACHABLE_EXIT", "parse_backend_options"]

CONTRACT_TARGET = pytest.StashKey[tuple[str, Mapping[str, Any]]]()
"""Where `run_contract` hands the plugin a name and already-typed options, bypassing the command line."""
CONTRACT_EXTRAS = pytest.StashKey[tuple[Mapping[str, Any] | None, str | None]]()
"""Where `run_contract` hands the failing-backend options and the slot-limit option name."""
UNREACHABLE = pytest.StashKey[str]()
"""Set when the backend's server could not be reached: the message, for the verdict."""
UNREACHABLE_EXIT = 3
"""The exit status of a session ended because the server could not be reached (no contract checked)."""

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
        "--failing-backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option making every request fail (e.g. url=http://127.0.0.1:9); repeatable",
    )
    group.addoption(
        "--slot-limit-option",
        default=None,
        metavar="NAME",
        help="the adapter option sizing its own pool or slots (e.g. max_connections)",
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


def _extras(config: pytest.Config) -> tuple[Mapping[str, Any] | None, str | None]:
    if CONTRACT_EXTRAS in config.stash:
        return config.stash[CONTRACT_EXTRAS]
    failing = config.getoption("failing_backend_option")
    return (parse_backend_options(failing) if failing else None), config.getoption("slot_limit_option")


def _unreachable(config: pytest.Config, name: str, error: BaseException) -> None:
    message = f"cannot reach the server of backend {name!r}: {type(error).__name__}: {error}"
    config.stash[UNREACHABLE] = message
    pytest.exit(message, returncode=UNREACHABLE_EXIT)


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
def registered_backend(
    pytestconfig: pytest.Config, backend_name: str, backend_options: dict[str, Any]
) -> Iterator[Any]:
    """The backend built once from the command line, shared by the session and closed at its end.

    One short request goes first: a server that cannot be reached ends the session (`UNREACHABLE_EXIT`).
    """
    from .._loop import get_loop_manager

    try:
        backend = create_backend(backend_name, **backend_options)
    except BackendUnavailableError as exc:
        _unreachable(pytestconfig, backend_name, exc)
    probe = GenerationRequest("Hello", SamplingParams(max_tokens=1), request_id="reachability-probe")
    try:
        get_loop_manager().run(backend.generate(probe))
    except BackendUnavailableError as exc:
        get_loop_manager().run(backend.aclose())
        _unreachable(pytestconfig, backend_name, exc)
    except Exception:
        pass
    yield backend
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
    _close_all(built)


def _factory(name: str, options: Mapping[str, Any]) -> tuple[Callable[..., Any], list[Any]]:
    built: list[Any] = []

    def make(**more: Any) -> Any:
        backend = create_backend(name, **{**options, **more})
        built.append(backend)
        return backend

    return make, built


def _close_all(built: list[Any]) -> None:
    from .._loop import get_loop_manager

    for backend in built:
        get_loop_manager().run(backend.aclose())


@pytest.fixture(scope="session")
def make_failing_registered_backend(
    pytestconfig: pytest.Config, backend_name: str, backend_options: dict[str, Any]
) -> Iterator[Callable[[], Any] | None]:
    """Backends built with the failing-backend options over the others; ``None`` when none were given."""
    failing, _ = _extras(pytestconfig)
    if not failing:
        yield None
        return
    make, built = _factory(backend_name, {**backend_options, **failing})
    yield make
    _close_all(built)


@pytest.fixture(scope="session")
def make_slot_limited_registered_backend(
    pytestconfig: pytest.Config, backend_name: str, backend_options: dict[str, Any]
) -> Iterator[Callable[[int], Any] | None]:
    """``limit -> backend`` setting the slot-limit option to ``limit``; ``None`` when no option was named."""
    _, option = _extras(pytestconfig)
    if not option:
        yield None
        return
    make, built = _factory(backend_name, backend_options)
    yield lambda limit: make(**{option: limit})
    _close_all(built)
