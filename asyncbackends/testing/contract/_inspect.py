"""Looking inside a backend's attributes: loop-bound state on the wrong loop, secrets it holds.

The walk follows instance attributes, slots and containers a few levels deep (an engine object graph can be
huge) and never calls properties, so it cannot start anything or change the backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from types import FunctionType, MethodType, ModuleType
from typing import Any

from ...protocol import Secret

__all__ = ["foreign_loop_state", "held_secrets", "walk"]

_LEAVES = (
    str,
    bytes,
    bytearray,
    int,
    float,
    complex,
    bool,
    type(None),
    type,
    ModuleType,
    FunctionType,
    MethodType,
)
_MAX_ITEMS = 200


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        for n, (key, value) in enumerate(obj.items()):
            if n >= _MAX_ITEMS:
                return
            yield f"[{key!r}]", value
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for n, value in enumerate(obj):
            if n >= _MAX_ITEMS:
                return
            yield f"[{n}]", value
    else:
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            yield from ((f".{name}", value) for name, value in list(attributes.items()))
        for klass in type(obj).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if isinstance(name, str) and name not in ("__dict__", "__weakref__"):
                    try:
                        yield f".{name}", object.__getattribute__(obj, name)
                    except AttributeError:
                        continue


def walk(root: Any, max_depth: int = 3, max_objects: int = 20_000) -> Iterator[tuple[str, Any]]:
    """Yield ``(path, object)`` for what ``root`` holds, breadth first, each object once."""
    seen = {id(root)}
    level = [("backend", root)]
    count = 0
    for _ in range(max_depth):
        following = []
        for path, obj in level:
            for suffix, child in _children(obj):
                if id(child) in seen or isinstance(child, _LEAVES):
                    continue
                seen.add(id(child))
                count += 1
                if count > max_objects:
                    return
                yield path + suffix, child
                following.append((path + suffix, child))
        level = following


def _bound_loop(obj: Any) -> asyncio.AbstractEventLoop | None:
    if isinstance(obj, asyncio.AbstractEventLoop):
        return obj
    if isinstance(obj, asyncio.Future):
        return obj.get_loop()
    attributes = getattr(obj, "__dict__", None)
    loop = attributes.get("_loop") if isinstance(attributes, dict) else None
    if loop is None:
        try:
            loop = object.__getattribute__(obj, "_loop")
        except AttributeError:
            return None
    return loop if isinstance(loop, asyncio.AbstractEventLoop) else None


def foreign_loop_state(backend: Any, shared: asyncio.AbstractEventLoop) -> list[str]:
    """Describe each loop, future, task or loop-bound object the backend holds that is not on ``shared``."""
    found = []
    for path, obj in walk(backend):
        loop = _bound_loop(obj)
        if loop is not None and loop is not shared:
            state = "closed" if loop.is_closed() else ("running" if loop.is_running() else "idle")
            kind = "an event loop" if loop is obj else f"a {type(obj).__name__} bound to an event loop"
            found.append(f"{path} is {kind} other than the shared one ({state})")
    return found


def held_secrets(backend: Any) -> list[str]:
    """The values of the `Secret` objects the backend holds."""
    return [obj.get_secret_value() for _, obj in walk(backend) if isinstance(obj, Secret) and obj]
