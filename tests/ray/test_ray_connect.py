"""Reaching the cluster: an address that does not answer costs seconds, not minutes.

Each case runs in a subprocess of its own (this process may already be joined to the session's cluster),
with Ray's temp folder pointed at a fresh directory so the machine's real ``/tmp/ray`` is never touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT, session_processes

pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def dead_address() -> str:
    """A loopback address nothing listens on (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    # Short: Ray's sockets live under it, and a Unix socket path is limited to about 107 characters.
    path = Path(tempfile.mkdtemp(prefix="abray", dir="/tmp"))
    yield path
    left = session_processes(str(path))
    assert not left, "Ray processes left behind:\n" + "\n".join(left)
    shutil.rmtree(path, ignore_errors=True)


def run_script(script: str, ray_tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TMPDIR")}
    environment.update(RAY_TMPDIR=str(ray_tmp), RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=240
    )


def test_a_stale_address_file_starts_a_local_cluster_saying_so(ray_tmp: Path) -> None:
    address = dead_address()
    (ray_tmp / "ray").mkdir()
    address_file = ray_tmp / "ray" / "ray_current_cluster"
    address_file.write_text(address)  # what a cluster that died without `ray stop` leaves behind
    script = (
        "import logging, time\n"
        "import asyncbackends as ab\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "began = time.monotonic()\n"
        "b = ab.create_backend('ray', backend='mock', replicas=1, connect_timeout=2.0,\n"
        "    actor_options={'num_cpus': 0.5}, init_options={'num_cpus': 1, 'include_dashboard': False,\n"
        "    'object_store_memory': 80 * 1024**2})\n"
        "print(ab.run_batch(b, [ab.GenerationRequest('fresh')])[0].text)\n"
        "b.close()\n"
    )
    out = run_script(script, ray_tmp)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("fresh")
    warning = [line for line in out.stderr.splitlines() if "does not answer" in line]
    assert warning, out.stderr[-3000:]
    assert address in warning[0] and str(address_file) in warning[0] and "Starting a local" in warning[0]


def test_an_address_that_does_not_answer_fails_within_connect_timeout(ray_tmp: Path) -> None:
    address = dead_address()
    script = (
        "import sys, time\n"
        "import asyncbackends as ab\n"
        "for address in sys.argv[1:]:\n"
        "    began = time.monotonic()\n"
        "    try:\n"
        "        ab.create_backend('ray', backend='mock', address=address or None, connect_timeout=1.5)\n"
        "    except ab.BackendUnavailableError as exc:\n"
        "        print(f'{time.monotonic() - began:.2f}', exc)\n"
    )
    began = time.monotonic()
    environment = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TMPDIR")}
    environment.update(RAY_TMPDIR=str(ray_tmp), RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", script, address],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = out.stdout.splitlines()
    seconds, message = line.split(" ", 1)
    assert float(seconds) < 10  # bounded by connect_timeout, not Ray's minutes of retries
    assert address in message and "address=" in message and "connect_timeout" in message
    # RAY_ADDRESS, read when address=None, is named as the source.
    out = run_script(script.replace("sys.argv[1:]", "['']"), ray_tmp, RAY_ADDRESS=address)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = out.stdout.splitlines()
    assert address in line and "RAY_ADDRESS" in line
    assert time.monotonic() - began < 200
