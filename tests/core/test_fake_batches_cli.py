"""``python -m asyncbackends.testing.fake_openai_batches``: the look-alike's faults from the command line."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import asyncbackends as ab
from asyncbackends.testing._fake_openai.cli import batch_server_options

ROOT = Path(__file__).parents[2]


def test_flags_mirror_the_python_options() -> None:
    options = batch_server_options(["--hold", "--fail-batches", "1", "3", "--expire-batches", "2"])
    assert options["hold"] is True
    assert (options["fail_batches"], options["expire_batches"]) == ((1, 3), (2,))
    plain = batch_server_options([])
    assert plain["hold"] is False and plain["fail_batches"] == () and plain["expire_batches"] == ()


def _statuses(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/batches", timeout=10) as response:
        return [batch["status"] for batch in json.load(response)["data"]]


def test_a_held_batch_runs_on_sigusr1_and_the_second_fails() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "asyncbackends.testing.fake_openai_batches", "--hold"]
    proc = subprocess.Popen([*command, "--fail-batches", "2"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]  # "listening on URL", printed once it serves
        backend = ab.create_backend("openai", base_url=url, batch_poll_interval=0.05)
        request = [ab.GenerationRequest("hello", ab.SamplingParams(max_tokens=3))]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(ab.run_batch, backend, request, batch=True)
            deadline = time.monotonic() + 60
            while _statuses(url) != ["in_progress"]:  # held: the server answers nothing yet
                assert time.monotonic() < deadline and not first.done()
                time.sleep(0.05)
            proc.send_signal(signal.SIGUSR1)
            (answered,) = first.result(timeout=60)
        assert isinstance(answered, ab.GenerationResult)
        (failed,) = ab.run_batch(backend, request, batch=True, return_exceptions=True)
        assert isinstance(failed, ab.BackendError)
        assert _statuses(url) == ["failed", "completed"]  # newest first
        ab.get_loop_manager().run(backend.aclose())
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
