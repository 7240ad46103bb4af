"""GPU throughput of the vllm adapter against vLLM's offline path and a plain AsyncLLM gather.

One call of this script is one whole measurement on a GPU machine: it builds (or reuses) a synthetic
Llama-shaped model directory (``gpu_workload.py``: config.json and a locally trained tokenizer, no weights:
vLLM draws random ones with ``load_format="dummy"``), then runs each mode (``gpu_modes.py``) in its own
process, one after another, and writes JSON, a markdown table and a log under ``$OUT`` (or ``--out``),
rewritten after every step, so a call cut short still returns what it finished.

    python benchmarks/gpu_throughput.py build --model-dir /tmp/synth-1b
    python benchmarks/gpu_throughput.py build --shape 8b --tokenizer-from /tmp/synth-1b --model-dir /tmp/8b
    python benchmarks/gpu_throughput.py suite eager compiled --model-dir /tmp/synth-1b
    python benchmarks/gpu_throughput.py suite dp --model-dir /tmp/synth-1b     # needs two GPUs

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
import statistics
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
from gpu_workload import SHAPES, build_model, log  # noqa: E402

# -- the parent: suites of children, comparisons, the report --------------------------------------------

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


def _rate(part: dict[str, Any]) -> dict[str, float]:
    elapsed = part["elapsed_s"]
    rates = {"req_per_s": part["requests"] / elapsed, "elapsed_s": elapsed, "requests": part["requests"]}
    if "cpu_s" in part:  # the frontend process's CPU seconds per second of work
        rates["frontend_cpu"] = part["cpu_s"] / elapsed
    if "output_tokens" in part:
        rates |= {
            "output_tokens": part["output_tokens"],
            "prompt_tokens": part["prompt_tokens"],
            "out_tok_per_s": part["output_tokens"] / elapsed,
            "total_tok_per_s": (part["output_tokens"] + part["prompt_tokens"]) / elapsed,
        }
    return rates


def _same_greedy(reference: list[list[int]], other: list[list[int]], count: int) -> dict[str, Any]:
    pairs = list(zip(reference[:count], other[:count], strict=False))
    diverge = [
        next((i for i, (a, b) in enumerate(zip(r, o, strict=False)) if a != b), min(len(r), len(o)))
        for r, o in pairs
        if r != o
    ]
    return {
        "compared": len(pairs),
        "identical": sum(r == o for r, o in pairs),
        "identical_tokens": sum(sum(a == b for a, b in zip(r, o, strict=False)) for r, o in pairs),
        "tokens": sum(len(r) for r, _ in pairs),
        "median_first_divergence": sorted(diverge)[len(diverge) // 2] if diverge else None,
    }


def _pooled(runs: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One mode's processes run one after another (compiled-abba) as one run: rounds pooled in order.

    The first process's outputs stand for the mode (they are compared with offline's); the rates are the
    median round's; loglikelihood, the median process's.
    """
    done = [r for r in runs if r]
    if len(done) <= 1:
        return done[0] if done else None
    rounds = [r for run in done for r in run["generate"]["rounds"]]
    middle = sorted(rounds, key=lambda r: r["requests"] / r["elapsed_s"])[len(rounds) // 2]
    pooled = {**done[0], "init_s": [r["init_s"] for r in done], "processes": len(done)}
    pooled["generate"] = {**done[0]["generate"], **middle, "rounds": rounds}
    scored = sorted(
        (r for r in done if "loglikelihood" in r),
        key=lambda r: r["loglikelihood"]["requests"] / r["loglikelihood"]["elapsed_s"],
    )
    if scored:
        pooled["loglikelihood"] = {**done[0]["loglikelihood"], **scored[len(scored) // 2]["loglikelihood"]}
        pooled["loglikelihood"]["logprobs"] = done[0]["loglikelihood"]["logprobs"]
    return pooled


def summarize(suite: str, outcomes: dict[str, list[dict[str, Any] | None]], compare: int) -> dict[str, Any]:
    """Rates per mode, ratios to offline, greedy equality and scoring agreement with offline."""
    summary: dict[str, Any] = {}
    if suite != "dp":  # several processes of a mode ran one after another: pool them
        outcomes = {mode: [_pooled(runs)] for mode, runs in outcomes.items()}
    shards = [o for o in outcomes.get("offline", []) if o]
    if len(outcomes.get("offline", [])) > 1:  # dp: the shards ran together; the slower one is the time
        if len(shards) == len(outcomes["offline"]):
            merged = {
                "elapsed_s": max(s["generate"]["elapsed_s"] for s in shards),
                "requests": sum(s["generate"]["requests"] for s in shards),
                "prompt_tokens": sum(s["generate"]["prompt_tokens"] for s in shards),
                "output_tokens": sum(s["generate"]["output_tokens"] for s in shards),
            }
            summary["offline"] = {"generate": _rate(merged), "init_s": [s["init_s"] for s in shards]}
            summary["offline"]["shard_elapsed_s"] = [s["generate"]["elapsed_s"] for s in shards]
            rounds = zip(*(s["generate"]["rounds"] for s in shards), strict=True)
            summary["offline"]["generate"]["rounds_req_per_s"] = [
                sum(r["requests"] for r in pair) / max(r["elapsed_s"] for r in pair) for pair in rounds
            ]
        offline = None
    else:
        offline = shards[0] if shards else None
    for mode, runs in outcomes.items():
        if mode == "offline" and summary.get("offline"):
            continue
        run = runs[0] if runs else None
        if run is None:
            summary[mode] = None
            continue
        entry: dict[str, Any] = {"init_s": run["init_s"], "vllm": run.get("vllm")}
        entry["generate"] = _rate(run["generate"])
        entry["generate"]["rounds_req_per_s"] = [
            r["requests"] / r["elapsed_s"] for r in run["generate"]["rounds"]
        ]
        entry["generate"]["rounds_frontend_cpu"] = [
            r["cpu_s"] / r["elapsed_s"] for r in run["generate"]["rounds"] if "cpu_s" in r
        ]
        if "loglikelihood" in run:
            entry["loglikelihood"] = _rate(run["loglikelihood"])
        if offline is not None and mode != "offline":
            entry["greedy_vs_offline"] = _same_greedy(
                offline["generate"]["tokens"], run["generate"]["tokens"], compare
            )
            if "loglikelihood" in run and "loglikelihood" in offline:
                ours, theirs = run["loglikelihood"]["logprobs"], offline["loglikelihood"]["logprobs"]
                diffs = sorted(abs(a - b) for a, b in zip(ours, theirs, strict=False))
                entry["loglikelihood_vs_offline"] = {
                    "compared": len(diffs),
                    "max_abs_diff": diffs[-1] if diffs else None,
                    "median_abs_diff": diffs[len(diffs) // 2] if diffs else None,
                }
        summary[mode] = entry
    base = summary.get("offline")
    for mode, entry in summary.items():
        if entry and base and mode != "offline":
            for part in ("generate", "loglikelihood"):
                if part in entry and part in base:
                    entry[part]["ratio_to_offline"] = entry[part]["req_per_s"] / base[part]["req_per_s"]
            ours, theirs = (
                e.get("generate", {}).get("rounds_req_per_s", []) for e in (entry or {}, base or {})
            )
            if entry and base and mode != "offline" and len(ours) == len(theirs) > 1:
                # Round i of every mode ran the same prompts: compare like with like, then take the median.
                ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
                entry["generate"]["ratio_to_offline"] = statistics.median(ratios)
                entry["generate"]["round_ratios"] = ratios
    return summary


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| suite | mode | work | req/s | out tok/s | total tok/s | x offline | output tokens | start s |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    notes = []
    for suite, summary in results["suites"].items():
        for mode, entry in summary.items():
            if not entry:
                lines.append(f"| {suite} | {mode} | - | failed or skipped | | | | | |")
                continue
            for part in ("generate", "loglikelihood"):
                if part not in entry:
                    continue
                r = entry[part]
                ratio = (
                    f"{r['ratio_to_offline']:.2f}"
                    if "ratio_to_offline" in r
                    else "1.00"
                    if mode == "offline"
                    else ""
                )
                init = entry["init_s"]
                init_text = "/".join(f"{x:.0f}" for x in init) if isinstance(init, list) else f"{init:.0f}"
                lines.append(
                    f"| {suite} | {mode} | {part} | {r['req_per_s']:.1f} | {r.get('out_tok_per_s', 0):.0f} | "
                    f"{r.get('total_tok_per_s', 0):.0f} | {ratio} | {r.get('output_tokens', '')} | "
                    f"{init_text} |"
                )
            spread = entry.get("generate", {}).get("rounds_req_per_s", [])
            if len(spread) > 1:
                notes.append(
                    f"- {suite}/{mode}: generate rounds (req/s): {', '.join(f'{x:.1f}' for x in spread)}"
                )
            cpu = entry.get("generate", {}).get("rounds_frontend_cpu", [])
            if cpu:
                shares = ", ".join(f"{x:.2f}" for x in cpu)
                notes.append(f"- {suite}/{mode}: frontend CPU seconds per second, each round: {shares}")
            if len(entry.get("generate", {}).get("round_ratios", [])) > 1:
                ratios = entry["generate"]["round_ratios"]
                shares = ", ".join(f"{x:.2f}" for x in ratios)
                notes.append(f"- {suite}/{mode}: ratios to offline, round by round: {shares}")
            if "greedy_vs_offline" in entry:
                g = entry["greedy_vs_offline"]
                notes.append(
                    f"- {suite}/{mode}: greedy outputs identical to offline for "
                    f"{g['identical']}/{g['compared']} prompts ({g['identical_tokens']}/{g['tokens']} tokens "
                    "at equal positions; median first "
                    f"divergence at token {g['median_first_divergence']})"
                )
            if "loglikelihood_vs_offline" in entry:
                s = entry["loglikelihood_vs_offline"]
                notes.append(
                    f"- {suite}/{mode}: loglikelihoods vs offline over {s['compared']} pairs: max |diff| "
                    f"{s['max_abs_diff']:.2e}, median {s['median_abs_diff']:.2e}"
                )
    return "\n".join([*lines, "", *notes]) + "\n"


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
                    continue
                snapshot = {"suite": suite, "modes": modes, **machine_snapshot()}
                results["steps"].append(snapshot)
                log(f"{suite}: machine before {modes}: load {snapshot['loadavg']}, gpus {snapshot['gpus']}")
                outcome = _run_step(args, suite, step, deadline, logfile, number)
                for mode, one in zip(modes, outcome, strict=False):
                    outcomes.setdefault(mode, []).append(one)
                # After every step, so that a call cut short still brings back what it finished.
                results["suites"][suite] = summarize(suite, outcomes, args.compare)
                (out / f"gpu_{name}.json").write_text(json.dumps(results, indent=1))
                (out / f"gpu_{name}.md").write_text(markdown(results))
    print(markdown(results), flush=True)
    return 0 if all(all(results["suites"][s].values()) for s in args.suites) else 1


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
