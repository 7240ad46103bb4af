"""Which tests must share a pytest-xdist worker: those that share a fixture wider than one test.

`make unit` runs the suite on several workers (``-n``, ``--dist loadgroup``). Each worker is a process of its
own, with its own session: a session fixture used on two workers is set up twice. Ours start vLLM engines,
``vllm serve`` processes, Ray clusters and look-alike servers, so every test that uses one of them goes to
the same worker, in collection order (the ``test_zz_`` modules that must run after a fixture's other users
still do). Tests that share nothing are spread one by one.

The groups are found from pytest's own record of each test's fixtures, so a new test joins its fixture's
group without being listed anywhere. Fixtures that pytest or an installed plugin defines
(``tmp_path_factory``, the event loop policy) do not join anything: they are cheap and hold no engine.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

CHEAP_FIXTURES = frozenset({"tiny_model", "tiny_model_path", "base_model", "reference_max_tokens"})
"""Wide fixtures that only return a path or a number (the tiny model is built once, on disk, under a lock):
set up again on another worker costs nothing, so sharing one does not tie tests to one worker."""

ONE_WORKER_DIRECTORIES = frozenset({"ray"})
"""Test directories run whole on one worker: tests/ray starts Ray clusters (the session's, a multi-node one of
``ray start`` processes, one to connect to), and two at once on a small machine starve each other's raylets."""


@functools.cache  # asked for every fixture of every test: ~20,000 times a collection
def defined_here(func: Callable[..., object], root: Path) -> bool:
    """Whether a fixture function is this repository's (a conftest's, a test module's), not pytest's or an
    installed plugin's (the virtual environment may sit inside the repository, so its prefix is left out)."""
    try:
        path = Path(inspect.getfile(func)).resolve()
    except TypeError:  # a builtin
        return False
    return path.is_relative_to(root.resolve()) and not path.is_relative_to(Path(sys.prefix).resolve())


def shared_fixture_keys(item: pytest.Item) -> list[tuple[object, ...]]:
    """The wider-than-a-test fixtures of this repository that ``item`` uses, one key per instance.

    Args:
        item: A collected test.

    Returns:
        A key per fixture instance: tests with an equal key use the same instance (the same session or
        package fixture; the same module's or class's).
    """
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the fixtures an item uses
    if info is None:
        return []
    keys: list[tuple[object, ...]] = []
    directory = item.path.parent.name
    if directory in ONE_WORKER_DIRECTORIES:
        keys.append(("directory", directory))
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if not defs or defs[-1].scope == "function" or name in CHEAP_FIXTURES:
            continue
        fixturedef = defs[-1]
        if not defined_here(fixturedef.func, item.config.rootpath):
            continue
        node = {"session": None, "package": fixturedef.baseid, "module": item.path}.get(
            fixturedef.scope, getattr(item, "cls", None)
        )
        keys.append((id(fixturedef), node))
    return keys


def group_names(items: list[pytest.Item]) -> dict[int, str]:
    """Name a group for every test that shares a fixture with another (union-find over shared fixtures).

    Args:
        items: The collected tests, in collection order.

    Returns:
        ``id(item)`` to its group's name (the group's first test's module path and the group's number, so
        names are the same on every worker); tests that share no fixture are left out.
    """
    parent: dict[object, object] = {}

    def find(node: object) -> object:
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]  # type: ignore[index]
            node = parent[node]
        return node

    for item in items:
        for key in shared_fixture_keys(item):
            parent[find(("item", id(item)))] = find(key)
    first: dict[object, str] = {}
    names: dict[int, str] = {}
    for item in items:
        node = ("item", id(item))
        if node not in parent:
            continue
        root = find(node)
        # A group is named after its first test's module, numbered: two groups may start in one module.
        names[id(item)] = first.setdefault(root, f"{item.nodeid.split('::')[0]}#{len(first)}")
    return names


def mark_worker_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put every test that shares a fixture in its group: an ``xdist_group`` marker, and the ``@group``
    suffix on its node id that xdist's scheduler reads.

    Only under ``--dist loadgroup``; a plain ``pytest`` run is left as it is. Collection happens on the
    workers, where xdist has set ``dist`` to "no" and kept the choice in ``loadgroup``.
    """
    if not getattr(config.option, "loadgroup", False):
        return
    names = group_names(items)
    for item in items:
        if id(item) in names:
            item.add_marker(pytest.mark.xdist_group(names[id(item)]))
            add_group_suffix(item, names[id(item)])


def add_group_suffix(item: pytest.Item, group: str) -> None:
    """Append ``@group`` to the item's node id, as xdist's own hook means to.

    xdist (3.8) writes ``item._nodeid``, where pytest 9.2 keeps the id as ``item._id`` (a ``NodeId``): its
    suffix is lost and every test is scheduled alone, so each worker started every session engine
    (tests/core/test_worker_groups.py runs a suite on two workers to catch this). On a pytest that still
    keeps ``_nodeid``, xdist's hook adds the suffix itself.
    """
    if not hasattr(item, "_id"):
        return
    from _pytest.nodeid import coerce_node_id  # pytest's own parser for the id it stores

    item._id = coerce_node_id(f"{item.nodeid}@{group}")
