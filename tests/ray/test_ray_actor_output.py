"""The ``ray`` backend's actor process sends its stdout to stderr, without a cluster (no Ray is started).

Ray forwards a worker's stdout to the driver's stdout, so a hosted engine's logs would mix with a script's
output; `test_ray_backend.py` checks the whole path on a cluster, this the actor's part alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ACTOR_PROCESS = """
import os, subprocess, sys
from asyncbackends.adapters.ray._actor import ReplicaActor

ReplicaActor(0)  # what Ray runs first in the actor's worker process
print("printed")
sys.stdout.flush()
os.write(1, b"written to descriptor 1\\n")
subprocess.run([sys.executable, "-c", "print('from a child process')"], check=True)
"""


def test_the_actor_process_writes_stdout_to_stderr() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", ACTOR_PROCESS], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == ""
    assert out.stderr.splitlines()[-3:] == ["printed", "written to descriptor 1", "from a child process"]
