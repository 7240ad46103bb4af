"""GPU throughput of the vllm adapter against vLLM's offline path and a plain AsyncLLM gather.

One call of this script is one whole measurement on a GPU machine: it builds (or reuses) a synthetic
Llama-shaped model directory (``gpu_workload.py``: config.json and a locally trained tokenizer, no weights:
vLLM draws random ones with ``load_format="dummy"``), then runs each mode (``gpu_modes.py``) in its own
process, one after another, and writes JSON, a markdown table and a log under ``$OUT`` (or ``--out``),
rewritten after every step, so a call cut short still returns what it finished.

    python benchmarks/gpu/gpu_throughput.py build --model-dir /tmp/synth-1b
    python benchmarks/gpu/gpu_throughput.py build --shape 8b --tokenizer-from /tmp/synth-1b \
        --model-dir /tmp/8b
    python benchmarks/gpu/gpu_throughput.py suite eager compiled --model-dir /tmp/synth-1b
    python benchmarks/gpu/gpu_throughput.py suite dp --model-dir /tmp/synth-1b     # needs two GPUs

Building the tokenizer takes ~5 minutes on 2 CPU cores: build the directory once beforehand and carry it
(2.4 MB); another shape reuses it (``--tokenizer-from``). ``--repeats N`` times N generation rounds per
process, each on fresh prompts (the same prompts again would hit vLLM's prefix cache); ratios to offline
are the median of the per-round ratios, round i of one mode against round i of the other.

Suites (each mode a fresh process; only the work is timed, not engine start-up, after a small warm-up):
    eager      offline, adapter, plain, all with enforce_eager=True; loglikelihood in offline and adapter
    compiled   offline and adapter with torch.compile + CUDA graphs (enforce_eager=False), loglikelihood too
    compiled-abba
               compiled, in the order offline, adapter, adapter, offline: drift in the machine over the call
               (clocks, neighbours, the order of compilation) falls on both modes alike; rounds are pooled
    fp32       offline and adapter in float32 on the comparison prompts only: greedy equality without
               bf16's batch-dependent rounding
    dp         --gpus N (2 by default) offline processes (CUDA_VISIBLE_DEVICES=0 ... N-1) splitting the
               prompts, started together, timed by the slowest; then the adapter with data_parallel_size=N

Modes:
    offline  ``LLM(...).generate(token prompts, SamplingParams(temperature=0, max_tokens=128))``; scoring is
             ``LLM.generate`` with ``prompt_logprobs=0, max_tokens=1`` on the token ids the adapter would send
    adapter  ``ab.run_batch`` over ``ab.create_backend("vllm", ...)``, given only what a user must give
             (model, dtype, load_format, max_model_len, enforce_eager): no scheduler or concurrency tuning
    plain    ``asyncio.gather`` over ``AsyncLLM.generate`` (FINAL_ONLY), the engine built with vLLM's plain
             defaults: ``AsyncLLM.from_engine_args(AsyncEngineArgs(...))``

No mode uses ``ignore_eos`` (the adapter's SamplingParams has none): every mode is greedy on the same
prompts, so the work is the same, and each reports its output token count to show it. Each step's log
line records the GPU's clocks, temperature, power and use (nvidia-smi) and the host's load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

for _name, _value in {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not installed on the GPU image
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
}.items():
    os.environ.setdefault(_name, _value)

from gpu_modes import child  # noqa: E402  # the environment above comes first
from gpu_monitor import Monitor  # noqa: E402
from gpu_report import markdown, summarize  # noqa: E402
from gpu_workload import SHAPES, build_model, log  # noqa: E402

# -- the parent: suites of children, one process a mode --------------------------------------------------

SUITES: dict[str, list[list[tuple[str, dict[str, Any]]]]] = {
    # Each step's children run together (the dp shards); steps run one after another.
    "eager": [[("offline", {})], [("adapter", {})], [("plain", {"pairs": 0})]],
    "compiled": [[("offline", {"compiled": True})], [("adapter", {"compiled": True})]],
    "compiled-abba": [
        [("offline", {"compiled": True})],
        [("adapter", {"compiled": True})],
        [("adapter", {"compiled": True})],
        [("offline", {"compiled": True})],
    ],
    "fp32": [
        [("offline", {"dtype": "float32", "prompts": "compare", "pairs": 0})],
        [("adapter", {"dtype": "float32", "prompts": "compare", "pairs": 0})],
    ],
}


def _dp_suite(gpus: int) -> list[list[tuple[str, dict[str, Any]]]]:
    """``gpus`` offline processes, one per GPU, splitting the prompts; then the adapter with DP=``gpus``."""
    shards = [
        ("offline", {"pairs": 0, "shard": i, "num_shards": gpus, "env": {"CUDA_VISIBLE_DEVICES": str(i)}})
        for i in range(gpus)
    ]
    return [shards, [("adapter", {"pairs": 0, "data_parallel_size": gpus})]]


def _suite(name: str, args: argparse.Namespace) -> list[list[tuple[str, dict[str, Any]]]]:
    return _dp_suite(args.gpus) if name == "dp" else SUITES[name]


def _child_command(args: argparse.Namespace, mode: str, spec: dict[str, Any], result: Path) -> list[str]:
    prompts = args.compare if spec.get("prompts") == "compare" else args.prompts
    command = [sys.executable, os.path.abspath(__file__), "child", mode, "--model-dir", args.model_dir]
    command += [
        "--prompts",
        str(prompts),
        "--pairs",
        str(spec.get("pairs", args.pairs)),
        "--result",
        str(result),
    ]
    command += ["--max-tokens", str(args.max_tokens), "--max-model-len", str(args.max_model_len)]
    command += ["--dtype", spec.get("dtype", args.dtype)]
    command += ["--shard", str(spec.get("shard", 0)), "--num-shards", str(spec.get("num_shards", 1))]
    command += [
        "--data-parallel-size",
        str(spec.get("data_parallel_size", 1)),
        "--engine-extra",
        args.engine_extra,
        "--repeats",
        str(args.repeats),
    ]
    return command + (["--compiled"] if spec.get("compiled") else [])


def machine_snapshot() -> dict[str, Any]:
    """The GPUs' clocks, temperature, power and use, and the host's load: what drifts between steps."""
    query = "index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,utilization.gpu,memory.used"
    try:
        gpus = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        gpus = repr(exc)
    return {"time": time.strftime("%H:%M:%S"), "loadavg": os.getloadavg(), "gpus": gpus.splitlines()}


def _run_step(
    args: argparse.Namespace,
    suite: str,
    step: list[tuple[str, dict[str, Any]]],
    deadline: float,
    logfile: Any,
    number: int,
) -> list[dict[str, Any] | None]:
    """Start the step's children together, stream their output, and collect their results."""
    children = []
    for index, (mode, spec) in enumerate(step):
        result = Path(args.work_dir) / f"{suite}-{number}-{mode}-{index}.json"
        result.unlink(missing_ok=True)
        env = {**os.environ, **spec.get("env", {})}
        command = _child_command(args, mode, spec, result)
        log(f"{suite}: start {mode} {spec}")
        process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        children.append((f"{suite}/{mode}{index if len(step) > 1 else ''}", process, result))

    def pump(tag: str, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            text = f"{tag}| {line.rstrip()}"
            print(text, flush=True)
            logfile.write(text + "\n")

    pumps = [threading.Thread(target=pump, args=(tag, p), daemon=True) for tag, p, _ in children]
    for thread in pumps:
        thread.start()
    outcomes: list[dict[str, Any] | None] = []
    for tag, process, result in children:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log(f"{tag}: out of time, stopping it")
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)  # engine processes the child left behind
        outcome = json.loads(result.read_text()) if result.is_file() else None
        log(f"{tag}: exit {process.returncode}, {'result' if outcome else 'NO RESULT'}")
        outcomes.append(outcome)
    for thread in pumps:
        thread.join(timeout=5)
    return outcomes


def run_suites(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.deadline
    out = Path(args.out or os.environ.get("OUT") or "/tmp/gpu_throughput")
    out.mkdir(parents=True, exist_ok=True)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    build_model(Path(args.model_dir))
    name = "-".join(args.suites)
    results: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "func"}, "suites": {}}
    try:
        import torch

        results["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        results["torch"] = torch.__version__
    except Exception as exc:  # the report still says what ran
        results["gpu"] = repr(exc)
    results["steps"] = []

    def save(suite: str, outcomes: dict[str, list[dict[str, Any] | None]]) -> None:
        # After every step, run or skipped, so that a call cut short still brings back what it finished.
        results["suites"][suite] = summarize(suite, outcomes, args.compare)
        (out / f"gpu_{name}.json").write_text(json.dumps(results, indent=1))
        (out / f"gpu_{name}.md").write_text(markdown(results))

    monitor, samples = Monitor(), out / f"gpu_{name}_monitor.csv"
    try:
        with open(out / f"gpu_{name}.log", "w") as logfile:
            for suite in args.suites:
                outcomes: dict[str, list[dict[str, Any] | None]] = {}
                for number, step in enumerate(_suite(suite, args)):
                    left = deadline - time.monotonic()
                    modes = [mode for mode, _ in step]
                    if left < args.min_step:
                        log(f"{suite}: {left:.0f}s left, skipping {modes}")
                        for mode in modes:
                            outcomes.setdefault(mode, []).append(None)
                        save(suite, outcomes)
                        continue
                    snapshot = {"suite": suite, "modes": modes, **machine_snapshot()}
                    results["steps"].append(snapshot)
                    load, gpus = snapshot["loadavg"], snapshot["gpus"]
                    log(f"{suite}: machine before {modes}: load {load}, gpus {gpus}")
                    outcome = _run_step(args, suite, step, deadline, logfile, number)
                    for mode, one in zip(modes, outcome, strict=False):
                        monitor.attach(one)
                        outcomes.setdefault(mode, []).append(one)
                    save(suite, outcomes)
                    monitor.write(samples)  # after every step too, for a call cut short
    finally:
        monitor.stop()
        monitor.write(samples)
    print(markdown(results), flush=True)
    # Every mode of every suite has a result; a skipped or failed one is None.
    return 0 if all(all(results["suites"].get(s, {None: None}).values()) for s in args.suites) else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["build", "suite", "child"])
    parser.add_argument("names", nargs="*", help="suite: the suites to run; child: the mode")
    parser.add_argument("--model-dir", default="/tmp/synth-llama-1b")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b", help="build: the Llama shape")
    parser.add_argument("--layers", type=int, default=None, help="build: hidden layers (else the shape's)")
    parser.add_argument("--tokenizer-from", default=None, help="build: copy this model directory's tokenizer")
    parser.add_argument("--prompts", type=int, default=4000)
    parser.add_argument("--pairs", type=int, default=5000, help="loglikelihood pairs (0: none)")
    parser.add_argument("--compare", type=int, default=400, help="prompts whose greedy outputs are compared")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--deadline", type=float, default=560.0, help="suite: seconds for the whole call")
    parser.add_argument("--min-step", type=float, default=75.0, help="suite: skip a step with less time left")
    parser.add_argument("--out", default=None, help="suite: where results go ($OUT by default)")
    parser.add_argument("--work-dir", default="/tmp/gpu_throughput_work")
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--repeats", type=int, default=1, help="timed generation rounds per process (median)")
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--num-shards", type=int, default=1)
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=2, help="suite dp: GPUs (offline processes and DP size)")
    parser.add_argument("--result", default=None, help="child: where to write its result")
    parser.add_argument(
        "--engine-extra", default="{}", help="JSON engine options for every mode (CPU smoke test)"
    )
    args = parser.parse_args()
    if args.command == "build":
        source = Path(args.tokenizer_from) if args.tokenizer_from else None
        build_model(Path(args.model_dir), args.shape, layers=args.layers, tokenizer_from=source)
        return 0
    if args.command == "suite":
        unknown = [s for s in args.names if s not in [*SUITES, "dp"]]
        if unknown or not args.names:
            parser.error(f"suites: choose from {sorted([*SUITES, 'dp'])}")
        args.suites = args.names
        return run_suites(args)
    args.mode = args.names[0]
    result = child(args)
    Path(args.result).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
