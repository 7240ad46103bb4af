"""How ``asyncbackends run`` meets signals: SIGTERM and SIGHUP as Ctrl-C, engine processes out of their reach.

A terminal sends Ctrl-C's SIGINT to its whole foreground process group, and ``timeout`` sends SIGTERM to its
own group: an engine's processes (vLLM's engine core and workers, started with `multiprocessing`) would get
it beside the run's process, and vLLM's handlers end them under the requests they hold, printing a hundred
lines of tracebacks (``Worker proc VllmWorker-0 died unexpectedly``, ``EngineDeadError``) after the run's
summary. `engines_in_own_group` starts them in a process group of their own, so only the run's process gets
those signals; it aborts the requests, writes the summary and stops the engine in order.

`interrupt_on_termination` makes SIGTERM (schedulers, ``timeout``, ``kill``) and SIGHUP (a closed terminal)
interrupt the run as Ctrl-C does: finished results kept, provider batches cancelled, the engine stopped. The
exit status is the shell's convention for the signal (`exit_status`: 130 SIGINT, 143 SIGTERM, 129 SIGHUP).
"""

from __future__ import annotations

import contextlib
import multiprocessing.spawn
import os
import shlex
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

__all__ = ["Terminated", "engines_in_own_group", "exit_status", "interrupt_on_termination"]

# Runs the interpreter `multiprocessing` would have run, as the leader of a new process group. Written in
# POSIX sh so that no path needs to fit a "#!" line; setpgid then exec keeps the pid multiprocessing knows.
_LAUNCHER = """#!/bin/sh
exec {python} -I -S -c 'import os, sys; os.setpgid(0, 0); os.execv(sys.argv[1], sys.argv[1:])' {target} "$@"
"""

_lock = threading.Lock()
_holders = 0
_saved_executable: str | bytes | None = None
_launchers: list[tempfile.TemporaryDirectory[str]] = []  # removed at exit (its finaliser)
_isolate_forks = False


def _after_fork_in_child() -> None:
    global _isolate_forks
    if _isolate_forks:
        _isolate_forks = False  # the child's own children stay in the group it leads
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _launcher(target: str) -> str:
    if not _launchers:
        _launchers.append(tempfile.TemporaryDirectory(prefix="asyncbackends-"))
    path = Path(_launchers[0].name) / "python"
    path.write_text(_LAUNCHER.format(python=shlex.quote(sys.executable), target=shlex.quote(target)))
    path.chmod(0o700)
    return str(path)


@contextlib.contextmanager
def engines_in_own_group() -> Iterator[None]:
    """While held, processes `multiprocessing` starts (spawned or forked) lead a process group of their own.

    Their own children (an engine core's workers) join that group, so a signal sent to the caller's group
    reaches none of them; the caller stops them (vLLM sends its engine core SIGTERM). Only `multiprocessing`'s
    children are concerned: `subprocess` runs neither the spawn executable nor fork hooks.
    """
    global _holders, _saved_executable, _isolate_forks
    if sys.platform == "win32":  # pragma: no cover - no process groups; vLLM runs on POSIX
        yield
        return
    with _lock:
        if _holders == 0:
            _saved_executable = multiprocessing.spawn.get_executable()
            target = os.fsdecode(_saved_executable if _saved_executable is not None else sys.executable)
            multiprocessing.spawn.set_executable(_launcher(target))
            _isolate_forks = True
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                _isolate_forks = False
                multiprocessing.spawn.set_executable(_saved_executable)  # type: ignore[arg-type]


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so the run stops as it does on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(interrupt: BaseException) -> int:
    """The shell's status for a process ended by the signal behind ``interrupt``: 128 + its number."""
    return 128 + (interrupt.signum if isinstance(interrupt, Terminated) else signal.SIGINT)


@contextlib.contextmanager
def interrupt_on_termination() -> Iterator[None]:
    """While held, SIGTERM and SIGHUP raise `Terminated` in the main thread (elsewhere: nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (tests call main() from threads)
        return

    def terminate(signum: int, _: FrameType | None) -> None:
        raise Terminated(signum)

    names = [name for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    previous = {name: signal.signal(getattr(signal, name), terminate) for name in names}
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)
