"""Child processes that start engines: each in a process group of its own, stopped with the whole group.

vLLM's server and offline engine spawn an engine-core process (and workers) of their own; stopping only the
process we started can leave those running with no parent, holding gigabytes of memory after the tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
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


def wait_until_serving(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    """Wait until the server ``proc`` answers ``GET {url}/health`` with 200; fail the test if it exits first
    or is not ready within ``timeout`` seconds (its log's tail in the message)."""
    import pytest

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}:\n{log_tail(log)}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"the server was not ready after {timeout} s:\n{log_tail(log)}")
        time.sleep(0.5)


def log_tail(path: Path) -> str:
    """The last 3000 characters of a log file."""
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"
