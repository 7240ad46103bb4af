"""Child processes that start engines: each in a process group of its own, stopped with the whole group.

vLLM's server and offline engine spawn an engine-core process (and workers) of their own; stopping only the
process we started can leave those running with no parent, holding gigabytes of memory after the tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


def start_group(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen` in a new session, so the child and everything it spawns share one group."""
    return subprocess.Popen(args, start_new_session=True, **kwargs)


def stop_group(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM the whole group (vLLM shuts its engine down cleanly), then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    # Whatever outlived the leader (an engine core whose parent died first) goes now.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def engine_core_pids() -> list[int]:
    """This process's descendants that are vLLM engine cores."""
    import psutil

    pids = []
    for child in psutil.Process().children(recursive=True):
        try:  # a child may exit, or be a zombie not yet reaped, while we look
            if "EngineCore" in " ".join([*child.cmdline(), child.name()]):
                pids.append(child.pid)
        except psutil.Error:
            continue
    return pids
