"""Looking inside a backend's attributes: loop-bound state, credentials, connections left open.

Finds state bound to the wrong event loop, secrets held (in `Secret` or not), and sessions or sockets still
open after ``aclose()``.

The walk follows instance attributes, slots and containers a few levels deep (an engine object graph can be
huge) and never calls properties, so it cannot start anything or change the backend. It names an event loop
it meets but does not walk into it: the loop is the process's (the shared one, or a foreign one reported as
such), and asyncio's own loop holds its self-pipe sockets and every transport of every backend on it, which
are not the backend's to close.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from types import FunctionType, MethodType, ModuleType
from typing import Any
from urllib.parse import urlsplit

from ..._protocol import Secret

__all__ = ["foreign_loop_state", "held_secrets", "open_resources", "plain_credentials", "walk"]

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


def _children(obj: Any) -> Iterator[tuple[str, Any, Any]]:
    """``(path suffix, key or attribute name, value)`` for what ``obj`` holds directly."""
    if isinstance(obj, Mapping):
        for n, (key, value) in enumerate(obj.items()):
            if n >= _MAX_ITEMS:
                return
            yield f"[{key!r}]", key, value
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for n, value in enumerate(obj):
            if n >= _MAX_ITEMS:
                return
            yield f"[{n}]", n, value
    else:
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            yield from ((f".{name}", name, value) for name, value in list(attributes.items()))
        for klass in type(obj).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if isinstance(name, str) and name not in ("__dict__", "__weakref__"):
                    try:
                        yield f".{name}", name, object.__getattribute__(obj, name)
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
            for suffix, _, child in _children(obj):
                if id(child) in seen or isinstance(child, _LEAVES):
                    continue
                seen.add(id(child))
                count += 1
                if count > max_objects:
                    return
                yield path + suffix, child
                if not isinstance(child, asyncio.AbstractEventLoop):
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


# Mapping keys (header names, option names) whose values are credentials.
_CREDENTIAL_KEYS = re.compile(
    r"(?:^|[-_\s])(?:authorization|api[-_]?key|apikey|secret|password|passwd|cookie|credentials?)(?:$|[-_\s])"
    r"|^(?:x-)?(?:hf[-_]|auth[-_]|access[-_]|bearer[-_]|api[-_]|id[-_])?token$",
    re.I,
)
# Class names of the things that hold a connection or an engine: checked for being open after aclose().
_RESOURCE_NAMES = re.compile(r"session|client|connector|connection|pool|socket|transport", re.I)


def _own_packages(backend: Any) -> set[str]:
    own = {__name__.partition(".")[0]}
    for klass in type(backend).__mro__:
        module = getattr(klass, "__module__", "builtins")
        if module != "builtins":
            own.add(module.partition(".")[0])
    return own


def _userinfo_password(text: str) -> bool:
    if "://" not in text or "@" not in text:
        return False
    try:
        return bool(urlsplit(text.strip()).password)
    except ValueError:
        return False


def plain_credentials(backend: Any, secrets: Sequence[str] = (), max_depth: int = 4) -> list[str]:
    """Describe each credential the backend's own objects hold outside a `Secret`.

    Looks at the backend, the containers and the objects of its own packages (the adapter's and this
    library's; a client library's internals are that library's business) for: a known secret held as plain
    text, a URL with a password in its userinfo, a non-empty plain-text value under a credential-looking key
    (``Authorization``, ``X-API-Key``, ``api_key``, ``token``...).
    """
    own = _own_packages(backend)
    found: list[str] = []
    seen = {id(backend)}
    level: list[tuple[str, Any]] = [("backend", backend)]

    def check(path: str, key: Any, value: Any) -> None:
        if isinstance(value, str) and value:
            if any(secret and secret in value for secret in secrets):
                found.append(f"{path} holds the credential as a plain str")
            elif _userinfo_password(value):
                found.append(f"{path} is a URL with a password in its userinfo")
            elif isinstance(key, str) and _CREDENTIAL_KEYS.search(key):
                found.append(f"{path} is a credential ({key!r}) held as plain text")
        elif type(value).__name__ == "URL" and isinstance(getattr(value, "password", None), str):
            found.append(f"{path} is a URL with a password in its userinfo")

    for _ in range(max_depth):
        following = []
        for path, obj in level:
            for suffix, key, child in _children(obj):
                check(path + suffix, key, child)
                if id(child) in seen or isinstance(child, (*_LEAVES, Secret)):
                    continue
                seen.add(id(child))
                module = getattr(type(child), "__module__", "builtins")
                if module == "builtins" or module.partition(".")[0] in own:
                    following.append((path + suffix, child))
        level = following
    return sorted(set(found))


def _is_open(obj: Any) -> bool | None:
    if isinstance(obj, socket.socket):
        return obj.fileno() != -1
    if isinstance(obj, asyncio.BaseTransport):
        return not obj.is_closing()
    if not _RESOURCE_NAMES.search(type(obj).__name__):
        return None
    for name, open_when in (("closed", False), ("is_closed", False)):
        if hasattr(type(obj), name) or name in getattr(obj, "__dict__", {}):
            try:
                value = getattr(obj, name)
            except Exception:  # a property that cannot answer after close: nothing to report
                return None
            if callable(value):
                continue
            return value is open_when if isinstance(value, bool) else None
    return None


def open_resources(backend: Any) -> list[str]:
    """Describe each session, client, connector, socket or transport the backend holds that is still open."""
    return [
        f"{path} (a {type(obj).__module__}.{type(obj).__qualname__}) is still open"
        for path, obj in walk(backend, max_depth=4)
        if _is_open(obj)
    ]
