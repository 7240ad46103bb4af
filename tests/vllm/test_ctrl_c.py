"""Ctrl-C (a real SIGINT) during a blocking run_batch on a real engine, in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..processes import start_group, stop_group
from .conftest import ENGINE_OPTIONS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys, threading, time
    import psutil
    import asyncbackends as ab

    async def unfinished(backend):
        return backend.engine.get_num_unfinished_requests()

    def engine_cores():
        return [p for p in psutil.Process().children(recursive=True) if "EngineCore" in " ".join(p.cmdline())]

    def interrupt_when_in_engine(backend, count):
        # Ctrl-C once every request is inside the engine: the state the test is about, not a clock guess.
        while ab.get_loop_manager().run(unfinished(backend)) < count:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    if __name__ == "__main__":  # the engine core is a spawned process
        model, options = sys.argv[1], json.loads(sys.argv[2])
        backend = ab.create_backend("vllm", model=model, **options)
        long = [ab.GenerationRequest(f"Once upon a time {i}", ab.SamplingParams(max_tokens=480)) for i in range(16)]
        # One request first: vLLM asks the engine core once, on the first request, which tasks it supports;
        # asked of a stopped core, that question would never be answered.
        ab.run_batch(backend, [ab.GenerationRequest("warm", ab.SamplingParams(max_tokens=1))])
        cores = engine_cores()
        for core in cores:  # a stopped engine core finishes nothing: the requests are running when Ctrl-C comes
            core.suspend()
        threading.Thread(target=interrupt_when_in_engine, args=(backend, len(long)), daemon=True).start()
        try:
            ab.run_batch(backend, long)
            print("NOT INTERRUPTED", flush=True)
        except KeyboardInterrupt:
            print("interrupted", ab.get_loop_manager().run(unfinished(backend)), flush=True)
        for core in cores:
            core.resume()
        (again,) = ab.run_batch(backend, [ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=3))])
        print("again", len(again.completions[0].token_ids), flush=True)

        async def close_twice():  # from a loop of the caller's own, as an async harness would
            first = asyncio.ensure_future(backend.aclose())
            while not backend.closed:  # the first call has started its clean-up on the shared loop
                await asyncio.sleep(0.01)
            await backend.aclose()  # returns only once the first call's clean-up has ended
            running = [core for core in cores if core.is_running() and core.status() != psutil.STATUS_ZOMBIE]
            await first
            return len(running)

        print("engine cores left after the second aclose", asyncio.run(close_twice()), flush=True)
    """
)


def test_sigint_aborts_engine_requests_and_the_next_run_batch_works(tiny_model: str, tmp_path: Path) -> None:
    script = tmp_path / "ctrl_c.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    proc = start_group(
        [sys.executable, str(script), tiny_model, json.dumps(ENGINE_OPTIONS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=1100)
    finally:
        stop_group(proc)
    lines = out.decode().splitlines()
    assert "interrupted 0" in lines, (lines, err.decode()[-3000:])  # no engine request left running
    assert "again 3" in lines
    assert "engine cores left after the second aclose 0" in lines
    # vLLM's shutdown steps are not logged from this process; no task fails on a destroyed ZeroMQ context.
    assert "ContextTerminated" not in err.decode() and "force killing" not in out.decode() + err.decode()
    assert proc.returncode == 0
