"""``asyncbackends run`` and signals: SIGTERM cancels a run's batches; engine processes get no group signal.

The runs are processes of their own, signalled for real (SIGTERM on a plain run: test_cli.py's Ctrl-C test;
a real engine's processes: tests/vllm/test_cli_vllm.py).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from asyncbackends._cli.signals import engines_in_own_group
from asyncbackends.testing.fake_openai_batches import FakeOpenAIBatchServer

ROOT = Path(__file__).parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.asyncio
async def test_sigterm_cancels_the_runs_provider_batch(tmp_path: Path) -> None:
    """Without --cache nobody could read a batch left running: it is cancelled, not paid for and lost."""
    requests = tmp_path / "in.jsonl"
    requests.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(3)))
    async with FakeOpenAIBatchServer(hold=True) as server:
        args = ["run", str(requests), "--backend", "openai", "--batch", "--no-progress"]
        args += ["--option", f"base_url={server.url}", "--option", "batch_poll_interval=0.05"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "asyncbackends", *args, stderr=subprocess.PIPE, env=ENV, cwd=ROOT
        )
        await server.wait_until(lambda s: sum(s.polls.values()) >= 1)  # the batch is in progress
        proc.send_signal(signal.SIGTERM)
        _, err = await proc.communicate()
        server.release()  # a held batch asked to cancel is "cancelling" until then
        await server.wait_until(
            lambda s: next(iter(s.batches.values()))["status"] in ("completed", "cancelled")
        )
        (batch,) = server.batches.values()
        assert batch["status"] == "cancelled", err.decode()
    assert proc.returncode == 143, err.decode()
    assert server.paths["/v1/batches/{id}/cancel"] == 1 and not server.answered
    assert "interrupted: kept 0 of 3 results in standard output" in err.decode()


def _report_group(queue: multiprocessing.Queue[tuple[int, int]], inner_method: str | None) -> None:
    queue.put((os.getpid(), os.getpgid(0)))
    if inner_method is not None:
        inner = multiprocessing.get_context(inner_method).Process(target=_report_group, args=(queue, None))
        inner.start()
        inner.join()


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_engine_processes_lead_a_group_of_their_own_and_their_children_join_it(method: str) -> None:
    # A terminal's Ctrl-C goes to its foreground group: the run's group. vLLM's engine core is started with
    # multiprocessing (spawned on a CPU, forked by default on a GPU) and starts its workers the same way.
    context = multiprocessing.get_context(method)
    queue: multiprocessing.Queue[tuple[int, int]] = context.Queue()
    with engines_in_own_group():
        child = context.Process(target=_report_group, args=(queue, method))
        child.start()
        child.join(60)
    (pid, group), (inner_pid, inner_group) = queue.get(timeout=10), queue.get(timeout=10)
    assert child.exitcode == 0 and pid == child.pid
    assert group == pid != os.getpgid(0)  # the child leads a new group, out of the caller's
    assert inner_group == group and inner_pid != pid  # the engine core's workers join the engine core's
    later = context.Process(target=_report_group, args=(queue, None))  # outside: as before
    later.start()
    later.join(60)
    assert queue.get(timeout=10) == (later.pid, os.getpgid(0))
