"""A clean close of a real engine, in a process of its own: silent, no process or shared memory left behind.

vLLM's processes take seconds to exit (full-heap garbage collections on the way out, more on a busy
machine); killed before they finish, they leave a shared-memory segment that Python's resource tracker
reports at exit, and vLLM logs the kill. The test waits for the process (a generous limit, no wall-clock
assertion) and reads everything it printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from ..processes import start_group, stop_group
from .conftest import ENGINE_OPTIONS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys, warnings
    import asyncbackends as ab
    from tests.processes import engine_core_pids

    if __name__ == "__main__":  # the engine core is a spawned process
        warnings.simplefilter("always", ResourceWarning)  # see NOISE
        model, options = sys.argv[1], json.loads(sys.argv[2])
        backend = ab.create_backend("vllm", model=model, **options)
        (result,) = ab.run_batch(backend, [ab.GenerationRequest("Hello", ab.SamplingParams(max_tokens=4))])
        print("generated", len(result.completions[0].token_ids), flush=True)
        print("engine cores", len(engine_core_pids()), flush=True)
        asyncio.run(backend.aclose())  # from a loop of the caller's own, as an async harness would
        print("closed; engine cores left", len(engine_core_pids()), flush=True)
    """
)

# What a clean close must not print: vLLM killing its own processes (its grace was too short), the
# resource tracker finding a segment that a killed process did not free, or any traceback.
NOISE = (
    "cannot schedule new futures",
    "never retrieved",
    "output_handler failed",
    "workers still running after grace period",
    "force killing",
    "leaked shared_memory",
    "resource_tracker",
    "Traceback",
    "ContextTerminated",
    # Shown in the script's own process (Python hides them by default; not in vLLM's engine core process,
    # whose leftovers are vLLM's): an unclosed ZeroMQ context of the adapter's ("Unclosed context"), a socket
    # or a file. The suite ignores vLLM's own unclosed contexts (pyproject.toml), so this is where the
    # adapter's closing of its own is held.
    "ResourceWarning",
)


# What inspect and lm-eval do: the backend is left open and the process exits; the library closes it then.
AT_EXIT = textwrap.dedent(
    """
    import json, sys, warnings
    import asyncbackends as ab
    from tests.processes import engine_core_pids

    if __name__ == "__main__":
        warnings.simplefilter("always", ResourceWarning)  # see NOISE
        model, options = sys.argv[1], json.loads(sys.argv[2])
        backend = ab.create_backend("vllm", model=model, **options)
        (result,) = ab.run_batch(backend, [ab.GenerationRequest("Hello", ab.SamplingParams(max_tokens=4))])
        print("generated", len(result.completions[0].token_ids), flush=True)
        print("engine cores", len(engine_core_pids()), flush=True)
    """
)


# A test session's end (tests/ray's teardown): the manager's shutdown closes the backend on its loop, then the
# backend's own fixture closes it again from a new manager; that second close used to end in CancelledError.
AFTER_SHUTDOWN = AT_EXIT + textwrap.indent(
    textwrap.dedent(
        """
        ab.get_loop_manager().shutdown()
        backend.close()
        print("closed; engine cores left", len(engine_core_pids()), flush=True)
        """
    ).lstrip("\n"),
    "    ",
)


@pytest.mark.parametrize(
    "script_text", [SCRIPT, AT_EXIT, AFTER_SHUTDOWN], ids=["aclose", "at-exit", "after-shutdown"]
)
def test_close_is_silent_and_leaves_nothing_running(
    tiny_model: str, tmp_path: Path, script_text: str
) -> None:
    # at-exit: before the library closed its backends from a threading exit hook, every such run ended in
    # "Task exception was never retrieved ... cannot schedule new futures after interpreter shutdown".
    script = tmp_path / "close.py"
    script.write_text(script_text)
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    proc = start_group(
        [sys.executable, str(script), tiny_model, json.dumps(ENGINE_OPTIONS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=root,
    )
    try:
        out, err = proc.communicate(timeout=800)  # start-up (20-120 s here) and close: generous
        # Nothing of the group may outlive the script (an engine core left running by a half-done close).
        # Its resource tracker exits once it sees the script gone: waited for, with a generous bound.
        group = [p for p in psutil.process_iter() if _group_of(p.pid) == proc.pid]
        left = [p.pid for p in psutil.wait_procs(group, timeout=120)[1]]
    finally:
        stop_group(proc)
    stdout, stderr = out.decode(), err.decode()
    lines = stdout.splitlines()
    assert proc.returncode == 0, stderr[-3000:]
    assert "generated 4" in lines and "engine cores 1" in lines
    if script_text is SCRIPT:
        assert "closed; engine cores left 0" in lines  # aclose() returned once the engine's processes exited
    if script_text is AFTER_SHUTDOWN:
        # The second close returns without raising; the shutdown's own close may still be ending the engine
        # core then (its grace is on the clock), so nothing left is checked on the whole group below instead.
        assert any(line.startswith("closed; engine cores left") for line in lines)
    # vLLM logs to stdout by default; the library sends its logs to stderr, so stdout holds the script's
    # own lines alone. Both are read for noise (Python's warnings go to stderr).
    printed = (
        {line for line in lines if not line.startswith("closed; engine cores left")}
        if script_text is AFTER_SHUTDOWN
        else set(lines)
    )
    assert printed <= {"generated 4", "engine cores 1", "closed; engine cores left 0"}, stdout[-3000:]
    found = [line for line in (stdout + stderr).splitlines() if any(noise in line for noise in NOISE)]
    assert not found, found
    assert left == []


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_lm_eval_run_by_name_closes_its_engine_quietly(tiny_model: str, tmp_path: Path) -> None:
    """lm-eval's own command line builds the LM from its name and never closes it: it drops it.

    Before the LM closed the backend it built once dropped, the garbage collector tore the engine down
    out of order, printing vLLM's "force killing remaining process EngineCore", and a leaked shared-memory
    segment at exit, before the results table, in 4 of 4 runs.
    """
    root = Path(__file__).resolve().parents[2]
    options = {"model": tiny_model, **ENGINE_OPTIONS, "progress": False}
    model_args = "backend=vllm," + ",".join(f"{key}={value}" for key, value in options.items())
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "asyncbackends.integrations.lm_eval", "run", "--model", "asyncbackends"]
    command += ["--model_args", model_args, "--tasks", "ab_mc"]
    command += ["--include_path", str(root / "tests" / "data" / "lm_eval_tasks")]
    proc = start_group(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    try:
        out, err = proc.communicate(timeout=800)
    finally:
        stop_group(proc)
    stdout, stderr = out.decode(), err.decode()
    assert proc.returncode == 0, stderr[-3000:]
    assert "|ab_mc|" in stdout  # the results table
    found = [line for line in (stdout + stderr).splitlines() if any(noise in line for noise in NOISE)]
    found += [line for line in (stdout + stderr).splitlines() if "EngineDeadError" in line]
    assert not found, found
