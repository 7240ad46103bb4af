"""The adapter registry: names mapped to lazy ``"module:Class"`` targets.

Three sources, in order of precedence:

1. `register_backend` calls in this process (a clash with an existing name raises unless ``replace=True``);
2. the built-in adapters;
3. the ``asyncbackends.adapters`` entry-point group of installed distributions, read without importing
   anything. An entry point never shadows a built-in or a registered name (it is skipped with a logged
   warning); between two distributions offering one name, the first in distribution-name order wins.

Nothing is imported until `create_backend` builds an adapter, so importing ``asyncbackends`` imports no
engine, and a missing optional dependency surfaces as `BackendNotFoundError` with the pip command to run.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._install import pip_install
from ._loop import get_loop_manager
from ._protocol import AsyncBackend
from ._usage import as_pricing, attach_pricing
from .errors import BackendNotFoundError, InvalidRequestError

__all__ = [
    "ENTRY_POINT_GROUP",
    "acreate_backend",
    "available_backends",
    "check_options",
    "create_backend",
    "register_backend",
    "required_options",
]

ENTRY_POINT_GROUP = "asyncbackends.adapters"
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Builtin:
    target: str
    extra: str | None  # the pip extra that brings its dependencies
    requires: tuple[str, ...]  # modules that must be importable


_BUILTINS: dict[str, _Builtin] = {
    "mock": _Builtin("asyncbackends.adapters.mock:MockBackend", None, ()),
    "vllm": _Builtin(
        "asyncbackends.adapters.vllm:VLLMBackend",
        "vllm",
        ("vllm",),
    ),
    "tgi": _Builtin("asyncbackends.adapters.tgi:TGIBackend", "tgi", ("aiohttp", "huggingface_hub")),
    "openai": _Builtin("asyncbackends.adapters.openai:OpenAIBackend", "openai", ("aiohttp",)),
    "endpoints": _Builtin(
        "asyncbackends.adapters.endpoints:EndpointsBackend", "endpoints", ("aiohttp", "huggingface_hub")
    ),
    "pool": _Builtin("asyncbackends._wrappers.pool:PoolBackend", None, ()),
    "ray": _Builtin("asyncbackends.adapters.ray:RayBackend", "ray", ("ray",)),
}

_registered: dict[str, str] = {}


def register_backend(name: str, target: str, *, replace: bool = False) -> None:
    """Register an adapter class under ``name`` for this process.

    Args:
        name: The name `create_backend` will take.
        target: ``"package.module:Class"``; imported only when the backend is built.
        replace: Allow replacing an existing name (a built-in, an entry point or an earlier registration).

    Raises:
        InvalidRequestError: ``target`` is not ``"module:Class"``, or ``name`` is taken and not ``replace``.
    """
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise InvalidRequestError(f"target must look like 'package.module:Class', got {target!r}")
    if not replace and name in available_backends():
        raise InvalidRequestError(
            f"a backend named {name!r} is already registered ({available_backends()[name]}); "
            "pass replace=True to replace it"
        )
    _registered[name] = target


def _entry_points() -> dict[str, str]:
    found: dict[str, str] = {}
    eps = sorted(
        importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
        key=lambda ep: (ep.dist.name if ep.dist is not None else "", ep.name),
    )
    for ep in eps:
        if ep.name in _BUILTINS or ep.name in found:
            log.warning("entry point %r (%s) ignored: the name is already taken", ep.name, ep.value)
            continue
        found[ep.name] = ep.value
    return found


def available_backends() -> Mapping[str, str]:
    """Every backend name mapped to its ``"module:Class"`` target: built-ins, entry points, registrations."""
    names: dict[str, str] = {}
    names.update(_entry_points())
    names.update({name: b.target for name, b in _BUILTINS.items()})
    names.update(_registered)
    return dict(sorted(names.items()))


def extra_installed(name: str) -> bool | None:
    """Whether a built-in adapter's dependencies are importable; ``None`` for non-built-ins."""
    builtin = _BUILTINS.get(name)
    if builtin is None:
        return None
    return all(importlib.util.find_spec(module) is not None for module in builtin.requires)


def _resolve(name: str) -> str:
    backends = available_backends()
    if name in backends:
        return backends[name]
    if ":" in name:
        return name  # a "module:Class" target given directly
    close = difflib.get_close_matches(name, backends, n=3)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    raise BackendNotFoundError(f"no backend named {name!r}{hint} (available: {', '.join(backends)})")


def _load(name: str) -> Any:
    target = _resolve(name)
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        builtin = _BUILTINS.get(name)
        if builtin is not None and builtin.extra and exc.name and exc.name.split(".")[0] in builtin.requires:
            raise BackendNotFoundError(
                f"backend {name!r} needs {exc.name!r}, which is not installed: {pip_install(builtin.extra)}"
            ) from exc
        raise BackendNotFoundError(f"backend {name!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise BackendNotFoundError(f"backend {name!r}: {module_name!r} has no attribute {attr!r}") from exc


def check_options(backend: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Refuse options outside ``known``, naming the close matches: the one check every adapter shares.

    Raises:
        InvalidRequestError: One or more options are unknown.
    """
    known = sorted(known)
    unknown = [option for option in given if option not in known]
    if not unknown:
        return
    parts = []
    for option in unknown:
        close = difflib.get_close_matches(option, known, n=3, cutoff=0.6)
        parts.append(f"{option!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""))
    raise InvalidRequestError(f"unknown option(s) for backend {backend!r}: {', '.join(parts)}")


def _factory(cls: Any) -> tuple[Any, bool]:
    """What builds the adapter: its async ``create`` classmethod where it has one, else the class."""
    factory = getattr(cls, "create", None)
    if inspect.iscoroutinefunction(factory):
        return factory, True
    return cls, False


def _signature(target: Any) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: let the call itself complain
        return None


def _parameters(cls: Any, factory: Any) -> list[inspect.Parameter] | None:
    """The options ``factory`` takes: a ``create(**options)`` that names none takes the constructor's."""
    params = _signature(factory)
    if factory is not cls and params and all(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return _signature(cls)
    return params


_KEYWORDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _required(params: Iterable[inspect.Parameter]) -> tuple[str, ...]:
    return tuple(p.name for p in params if p.kind in _KEYWORDS and p.default is p.empty)


def required_options(name: str) -> tuple[str, ...]:
    """The options adapter ``name`` cannot be built without (its factory's parameters with no default).

    Lets a caller refuse an incomplete configuration before it starts anything (the CLI does, before it
    opens ``--output``); `create_backend` checks the same and raises `InvalidRequestError`.

    Raises:
        BackendNotFoundError: Unknown name, or the adapter's extra is not installed (with the pip command).
    """
    cls = _load(name)
    factory, _ = _factory(cls)
    return _required(_parameters(cls, factory) or ())


def _check_signature(name: str, cls: Any, factory: Any, options: Mapping[str, Any]) -> None:
    params = _parameters(cls, factory)
    if params is None:
        return
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        # else the adapter checks its own options (for example against vLLM's AsyncEngineArgs)
        check_options(name, options, [p.name for p in params if p.kind in _KEYWORDS])
    missing = [option for option in _required(params) if option not in options]
    if missing:  # one clear error, instead of the call's TypeError
        raise InvalidRequestError(f"backend {name!r} needs option(s) {', '.join(map(repr, missing))}")


def _check_protocol(name: str, backend: Any) -> None:
    missing = [
        m for m in ("name", "capabilities", "generate", "loglikelihood", "aclose") if not hasattr(backend, m)
    ]
    if missing:
        raise TypeError(f"backend {name!r} built a {type(backend).__name__} without {', '.join(missing)}")


async def acreate_backend(name: str, /, **options: Any) -> AsyncBackend:
    """Build a backend on the shared loop and return it; awaitable from any loop.

    An adapter class may define an async classmethod ``create(**options)`` (for engines whose start-up is
    asynchronous); otherwise the class is called with the options. The options are checked against the
    factory's parameters, the constructor's where ``create`` names none (it passes them on).

    Args:
        name: A registered name, or a ``"module:Class"`` target.
        **options: The adapter's own options, and ``pricing`` (an `ab.Pricing`, or a mapping of its
            fields), which every backend takes: the prices runs through it are charged at
            (`RunMetrics.cost`, cost budgets).

    Raises:
        BackendNotFoundError: Unknown name, or the adapter's extra is not installed (with the pip command).
        InvalidRequestError: An option the adapter does not know, or a required one missing.
    """
    # Checked before an engine starts; a mapping of its fields comes from model-args strings and files.
    pricing = None if options.get("pricing") is None else as_pricing(options.pop("pricing"))
    options.pop("pricing", None)
    cls = _load(name)
    factory, is_async = _factory(cls)
    _check_signature(name, cls, factory, options)

    async def build() -> AsyncBackend:
        backend = await factory(**options) if is_async else cls(**options)
        _check_protocol(name, backend)
        if pricing is not None:
            attach_pricing(backend, pricing)
        get_loop_manager().track(backend)
        return backend  # type: ignore[no-any-return]

    return await get_loop_manager().arun(build())


def create_backend(name: str, /, **options: Any) -> AsyncBackend:
    """Blocking `acreate_backend` for sync code: builds the backend on the shared loop.

    Raises:
        BackendNotFoundError: Unknown name, or the adapter's extra is not installed (with the pip command).
        InvalidRequestError: An option the adapter does not know, or a required one missing.
        LoopError: Called from the shared loop's own thread (await `acreate_backend` there).
    """
    return get_loop_manager().run(acreate_backend(name, **options))
