"""`asyncbackends run --backend vllm` in a process of its own: stdout carries the results and nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..processes import start_group, stop_group
from .conftest import ENGINE_OPTIONS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).parents[2]
DEMO = ROOT / "examples" / "demo.jsonl"


def test_stdout_is_valid_jsonl_with_a_real_engine(tiny_model: str) -> None:
    options = [f"--option=model={tiny_model}"]
    options += [f"--option={key}={json.dumps(value)}" for key, value in ENGINE_OPTIONS.items()]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = start_group(
        [sys.executable, "-m", "asyncbackends", "run", str(DEMO), "--backend", "vllm", *options, "--warm-up"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    try:
        out, err = proc.communicate(timeout=1100)
    finally:
        stop_group(proc)
    stderr = err.decode()
    assert proc.returncode == 0, stderr[-3000:]
    records = [json.loads(line) for line in out.decode().splitlines()]  # every stdout line is a record
    inputs = DEMO.read_text().splitlines()
    assert [r["index"] for r in records] == list(range(len(inputs)))
    assert all("result" in r for r in records), records
    assert "INFO" in stderr  # vLLM's logs (the engine core's too) went to stderr
    assert f"requests: {len(inputs)} " in stderr  # the summary counts the run, not the warm-up
    assert "Traceback" not in stderr and "force killing" not in stderr


def test_ctrl_c_during_engine_start_up_exits_130_and_leaves_no_engine(
    tiny_model: str, tmp_path: Path
) -> None:
    import psutil

    options = [f"--option=model={tiny_model}"]
    options += [f"--option={key}={json.dumps(value)}" for key, value in ENGINE_OPTIONS.items()]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1"}
    # stderr to a file: nobody reads a pipe while the engine starts, and a full pipe would stall its logs.
    log = (tmp_path / "stderr.txt").open("wb")
    proc = start_group(
        [sys.executable, "-m", "asyncbackends", "run", str(DEMO), "--backend", "vllm", *options],
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        cwd=ROOT,
    )
    try:
        cli = psutil.Process(proc.pid)

        def engine_cores() -> list[psutil.Process]:
            found = []
            for child in cli.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "EngineCore" in " ".join([*child.cmdline(), child.name()]):
                        found.append(child)
            return found

        deadline = time.monotonic() + 900
        while not (cores := engine_cores()):  # the engine is starting: its core process exists
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        stop_group(proc)
        log.close()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 130, stderr[-3000:]
    tail = stderr[-3000:]  # every assertion shows it: a failure here has been seen once, on a loaded machine
    assert "asyncbackends run: interrupted while the backend was starting: nothing was sent\n" in stderr, tail
    assert "FATAL" not in stderr and "Traceback" not in stderr, tail
    assert out == b"", (out[-2000:], tail)
    alive = [core for core in cores if core.is_running() and core.status() != psutil.STATUS_ZOMBIE]
    assert not alive, ([(core.pid, core.status()) for core in alive], tail)
