"""The shared memory a killed vLLM engine core leaves behind, unlinked once its processes are gone.

An engine core and its worker talk through POSIX shared memory ring buffers (multiprocessing's
``SharedMemory``, ``/dev/shm/psm_*``; the engine core's own is 160 MB on a CPU). Each creator unlinks its
buffer when it exits; an engine core killed outright (SIGKILL, the out-of-memory killer) cannot, and its
buffer would stay in RAM until this process exits (Python's resource tracker then warns about "leaked
shared_memory objects" and unlinks it). So the segments an engine core maps are noted when it starts
(`note_segments`), and `release_segments`, called once the engine is stopped, unlinks those that outlived
it, after the core's workers have exited (a worker notices its parent's death and unlinks its own buffer
itself: unlinking it first would make it fail). After a clean stop nothing is left to unlink. Linux only
(it reads ``/proc``); elsewhere nothing is noted.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from pathlib import Path
from typing import Any

__all__ = ["engine_segments", "note_segments", "release_segments"]

_SHM = Path("/dev/shm")
_PROC = Path("/proc")
# How long a dead core's workers get to notice it and exit before their leftovers are unlinked (they poll for
# their parent's death; seconds on a loaded machine). Past it nothing is unlinked: a live worker may use it.
_WORKER_EXIT_TIMEOUT = 60.0

# An engine -> (the segments its cores map, its cores' child processes), noted at start.
_NOTED: weakref.WeakKeyDictionary[Any, tuple[list[str], list[int]]] = weakref.WeakKeyDictionary()


def _core_pids(engine: Any) -> list[int]:
    manager = getattr(getattr(engine, "engine_core", None), "resources", None)
    processes = getattr(getattr(manager, "engine_manager", None), "processes", None) or []
    return [int(p.pid) for p in processes if getattr(p, "pid", None) is not None]


def engine_segments(engine: Any) -> list[str]:
    """The names of the shared memory segments the engine's core processes map now (``[]`` where unknown)."""
    names: set[str] = set()
    for pid in _core_pids(engine):
        try:
            maps = (_PROC / str(pid) / "maps").read_text(encoding="utf-8", errors="replace")
        except OSError:  # no /proc here, or the process is gone
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, then the path if any
            path = Path(fields[5]) if len(fields) == 6 else None
            if path is not None and path.parent == _SHM and path.name.startswith("psm_"):
                names.add(path.name)
    return sorted(names)


def _children(parents: list[int]) -> list[int]:
    """The processes whose parent is one of ``parents`` (read from ``/proc/*/stat``)."""
    found = []
    for entry in _PROC.glob("[0-9]*/stat"):
        try:
            stat = entry.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (name) ": state, ppid, ...
        if len(fields) > 1 and fields[1].isdigit() and int(fields[1]) in parents:
            found.append(int(entry.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = (_PROC / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")  # a zombie has exited


def note_segments(engine: Any) -> None:
    """Note the engine's segments and its cores' workers (once it has started)."""
    _NOTED[engine] = (engine_segments(engine), _children(_core_pids(engine)))


def release_segments(engine: Any) -> None:
    """Unlink the noted segments that outlived the stopped engine, once its workers have exited. Blocking."""
    names, workers = _NOTED.pop(engine, ([], []))
    names = [name for name in names if (_SHM / name).exists()]
    if not names:
        return  # a clean stop: each creator unlinked its own
    deadline = time.monotonic() + _WORKER_EXIT_TIMEOUT
    while any(_alive(pid) for pid in workers):
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    from multiprocessing import resource_tracker

    for name in names:
        try:
            (_SHM / name).unlink()
        except OSError:
            continue  # unlinked by its creator meanwhile
        # Its creator registered it with the resource tracker this process shares with the processes it
        # spawns, which would otherwise warn about it, and try to unlink it again, at exit.
        with contextlib.suppress(Exception):
            resource_tracker.unregister(f"/{name}", "shared_memory")
