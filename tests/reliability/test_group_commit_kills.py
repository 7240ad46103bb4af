"""Group commit under SIGKILL: 20 runs killed at random points, each resumed from its cache.

Each child prints every request as it completes (its index and the system-wide monotonic clock, shared by
every process on the machine) and is SIGKILLed after a random number of completions. The resume must give
every request exactly one result, equal to an undisturbed run's; send exactly the requests the file did not
hold; and the results the kill lost (completed, not committed) must all have completed within the last
commit window before the kill (plus the slack of one commit on a busy machine).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import asyncbackends as ab
from asyncbackends._cache_writer import DEFAULT_WINDOW

N = 3_000
TRIALS = 20
SLACK = 1.0  # seconds a group's commit may take on a loaded 2-core machine after its window closed
SCRIPT = textwrap.dedent(
    f"""
    import sys, time
    import asyncbackends as ab

    def done(event):
        sys.stdout.write(f"{{event.index}} {{time.monotonic()}}\\n")
        sys.stdout.flush()

    backend = ab.create_backend("mock", latency=0.002)
    requests = [ab.GenerationRequest(f"prompt {{i}}", request_id=str(i)) for i in range({N})]
    callbacks = ab.RunCallbacks(on_request_done=done)
    ab.run_batch(backend, requests, concurrency=16, cache=sys.argv[1], callbacks=callbacks)
    print("FINISHED", flush=True)
    """
)


def requests() -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"prompt {i}", request_id=str(i)) for i in range(N)]


def stored_keys(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT key FROM results")}


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_run_killed_at_a_random_point_resumes_losing_at_most_the_last_window(
    tmp_path: Path, trial: int
) -> None:
    cache = tmp_path / "run.sqlite"
    kill_after = random.Random(trial).randrange(1, N - 100)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(cache)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    completed: dict[int, float] = {}
    for line in child.stdout:  # the child's completions, as they happen
        index, when = line.split()
        completed[int(index)] = float(when)
        if len(completed) >= kill_after:
            break
    os.kill(child.pid, signal.SIGKILL)  # no clean-up of any kind
    killed_at = time.monotonic()
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL

    undisturbed = ab.run_batch(ab.create_backend("mock"), requests())
    backend = ab.create_backend("mock")
    keyed = {ab.ResponseCache.key(None, backend, r): i for i, r in enumerate(requests())}  # type: ignore[arg-type]
    held = {keyed[k] for k in stored_keys(cache)}
    lost = {i for i in completed if i not in held}
    late = {
        i: round(killed_at - completed[i], 3)
        for i in lost
        if killed_at - completed[i] > DEFAULT_WINDOW + SLACK
    }
    assert not late, f"results lost to the kill that completed more than a window before it: {late}"

    metrics = ab.RunMetrics()
    resumed = ab.run_batch(backend, requests(), cache=cache, metrics=metrics)
    assert resumed == undisturbed  # every request, one result each, in order, equal to the undisturbed run
    assert metrics.cache_hits == len(held)
    sent = {int(request_id) for request_id in backend.attempts if request_id is not None}
    assert sent == set(range(N)) - held  # exactly what the file did not hold: nothing twice, nothing lost
    assert set(backend.attempts.values()) == {1}
    assert len(stored_keys(cache)) == N
