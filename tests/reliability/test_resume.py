"""A run killed with SIGKILL part-way resumes from its cache: only what is missing is sent again."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import asyncbackends as ab

# 2000 at 4 at a time, 20 ms each: the run lasts 10 s, so a test process a loaded machine leaves waiting
# between seeing 60 results and its SIGKILL cannot find the run already finished (at 400 it lasted 2 s).
N = 2000
SCRIPT = textwrap.dedent(
    f"""
    import sys
    import asyncbackends as ab

    backend = ab.create_backend("mock", latency=0.02)
    requests = [ab.GenerationRequest(f"prompt {{i}}", request_id=str(i)) for i in range({N})]
    ab.run_batch(backend, requests, concurrency=4, cache=sys.argv[1])
    print("FINISHED")
    """
)


def _entries(path: Path) -> int:
    try:
        with sqlite3.connect(path) as db:
            return int(db.execute("SELECT COUNT(*) FROM results").fetchone()[0])
    except sqlite3.Error:
        return 0


def test_sigkilled_run_resumes_sending_only_the_missing_requests(tmp_path: Path) -> None:
    cache = tmp_path / "run.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(cache)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while _entries(cache) < 60 and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)  # no clean-up of any kind: the worst instant is any instant
    out, _ = proc.communicate(timeout=30)
    assert "FINISHED" not in out
    saved = _entries(cache)
    assert 60 <= saved < N

    backend = ab.create_backend("mock")
    metrics = ab.RunMetrics()
    requests = [ab.GenerationRequest(f"prompt {i}", request_id=str(i)) for i in range(N)]
    results = ab.run_batch(backend, requests, cache=cache, metrics=metrics)
    assert [r.text for r in results] == [f"prompt {i}" for i in range(N)]
    assert [r.request_id for r in results] == [str(i) for i in range(N)]
    assert metrics.cache_hits == saved
    assert sum(backend.attempts.values()) == N - saved  # nothing sent twice, nothing lost
    assert _entries(cache) == N
