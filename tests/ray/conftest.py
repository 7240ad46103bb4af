"""One local Ray cluster per test session (``ray.init(num_cpus=2)``), stopped at the end with nothing left.

Starting a cluster costs 20-40 s on a loaded 2-core machine, so every test joins this one (the backend keeps
a cluster it did not start). Its memory is kept small: a minimal object store, no dashboard. At the end the
fixture checks that no process of the cluster's session is left running.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


def session_processes(session_dir: str) -> list[str]:
    """Processes still running whose command line names the Ray session directory (raylet, GCS, workers)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if session_dir in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.info['pid']}: {cmdline[:120]}")
        except psutil.Error:
            continue
    return found


def stop_ray_children() -> None:
    """Kill this process's Ray descendants (only ever called before our own cluster starts)."""
    import psutil

    children = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
            if (
                child.name() in ("gcs_server", "raylet")
                or "-packages/ray/" in cmdline
                or cmdline.startswith("ray::")
            ):
                children.append(child)
        except psutil.Error:
            continue
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=30)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    if ray.is_initialized():
        pytest.fail("Ray was already initialised in this process")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local test cluster: no token file in $HOME
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # On a loaded machine the raylet's wait for its agent's port file (30 s by default) can run out: the
    # raylet then aborts and ray.init fails. Wait longer, and try once more if the start still fails.
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")
    os.environ.setdefault("RAY_agent_register_timeout_ms", "120000")
    # Ray runs its workers at nice 15 (the raylet's worker_niceness), and vLLM's engine processes inherit it:
    # beside busy processes at nice 0 an actor then gets a few percent of a core, and a replica's vLLM import
    # alone took five to six minutes on a 2-core machine with two busy loops. The workload is the test's own.
    os.environ.setdefault("RAY_worker_niceness", "0")
    for attempt in (1, 2):
        try:
            context = ray.init(
                num_cpus=2,
                object_store_memory=80 * 1024**2,
                include_dashboard=False,
                # Actors import this checkout's asyncbackends and tests (not an installed copy).
                runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
                log_to_driver=False,
            )
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
            # ray.shutdown() after a failed start leaves the processes it did start (GCS, dashboard,
            # monitors): stop them, then drop their handles without ResourceWarnings.
            stop_ray_children()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                gc.collect()
    session_dir = ray._private.worker._global_node.get_session_dir_path()
    yield context
    ab.get_loop_manager().shutdown()  # closes any backend a failed test left open, before Ray goes
    ray.shutdown()
    deadline = time.monotonic() + 30
    while (left := session_processes(session_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "Ray processes left behind:\n" + "\n".join(left)


def run(coro: Any) -> Any:
    return ab.get_loop_manager().run(coro)


def make_ray_backend(backend: str = "mock", replicas: int = 2, **options: Any) -> Any:
    options.setdefault("actor_options", {"num_cpus": 0.25})
    return ab.create_backend("ray", backend=backend, replicas=replicas, **options)
