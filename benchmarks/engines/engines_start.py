"""How long ``create_backend("vllm", engines=N)`` takes to start, one wave at a time or several at once.

Issue 29 asks that engines start concurrently where vLLM allows: on a CPU they start together, on a GPU one
after another (docs/adapters/vllm.md, "Start-up"). Each mode is a fresh process; each starts N engines, notes
when each engine's build began and ended (overlapping builds started together), generates greedily on the same
token-id prompts and writes the outputs, which must be the same in every mode.

    python benchmarks/engines/engines_start.py --model-dir DIR --engines 6 --kv-gib 12 --modes profiled sized

Modes: ``profiled`` (vLLM sizes each KV cache), ``sized`` (``kv_cache_memory_bytes`` given), each eager;
``-compiled`` variants with torch.compile and CUDA graphs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu"))

os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not installed on the GPU image
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from gpu_workload import generation_prompts, log

MODES = ("profiled", "sized", "profiled-compiled", "sized-compiled")


def child(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    import asyncbackends as ab
    from asyncbackends.adapters.vllm import _engine_lifecycle as _vllm_engine

    builds: list[tuple[float, float]] = []
    real = _vllm_engine.AsyncLLM.from_engine_args

    def timed(*a: Any, **k: Any) -> Any:  # when each engine's build began and ended
        began = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            builds.append((began, time.perf_counter()))

    _vllm_engine.AsyncLLM.from_engine_args = timed  # type: ignore[method-assign]
    options: dict[str, Any] = {
        "dtype": args.dtype,
        "load_format": "dummy",
        "max_model_len": args.max_model_len,
        "enforce_eager": not mode.endswith("-compiled"),
    }
    if mode.startswith("sized"):
        options["kv_cache_memory_bytes"] = args.engines * int(args.kv_gib * (1 << 30))
    start = time.perf_counter()
    backend = ab.create_backend("vllm", model=args.model_dir, engines=args.engines, **options)
    started = time.perf_counter() - start
    log(f"{mode}: {args.engines} engines started in {started:.1f}s")
    vocab = json.loads((Path(args.model_dir) / "config.json").read_text())["vocab_size"]
    greedy = ab.SamplingParams(max_tokens=128, temperature=0.0)
    requests = [ab.GenerationRequest(tuple(p), greedy) for p in generation_prompts(args.prompts, vocab)]
    began = time.perf_counter()
    results = ab.run_batch(backend, requests)
    elapsed = time.perf_counter() - began
    caches = [e.engine.vllm_config.cache_config for e in backend.engines]
    backend.close()
    first = min(b for b, _ in builds)
    return {
        "mode": mode,
        "start_s": started,
        "builds": [(round(b - first, 2), round(e - first, 2)) for b, e in sorted(builds)],
        "gpu_blocks": [c.num_gpu_blocks for c in caches],
        "utilization": [c.gpu_memory_utilization for c in caches],
        "req_per_s": len(requests) / elapsed,
        "tokens": [list(r.completions[0].token_ids) for r in results],
    }


def _overlapping(builds: list[list[float]]) -> int:
    """The most builds in progress at one moment."""
    edges = sorted([(b, 1) for b, _ in builds] + [(e, -1) for _, e in builds], key=lambda x: (x[0], x[1]))
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--engines", type=int, default=6)
    parser.add_argument("--kv-gib", type=float, default=12.0, help="sized modes: each engine's KV cache, GiB")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--deadline", type=float, default=500.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        Path(args.result).write_text(json.dumps(child(args, args.child)))
        return 0
    out = Path(os.environ.get("OUT", "/tmp"))
    deadline = time.monotonic() + args.deadline
    rows: list[dict[str, Any]] = []
    for mode in args.modes:
        left = deadline - time.monotonic()
        if left < 60:
            log(f"{mode}: skipped, {left:.0f}s left")
            continue
        result = out / f"engines_start_{mode}.json"
        result.unlink(missing_ok=True)
        command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--child", mode]
        # A session of its own, so that a child out of time goes with every engine process it started.
        process = subprocess.Popen([*command, "--result", str(result)], start_new_session=True)
        try:
            process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            log(f"{mode}: out of time after {left:.0f}s, stopping it")
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.returncode != 0 or not result.is_file():
            log(f"{mode}: failed (exit {process.returncode})")
            continue
        rows.append(json.loads(result.read_text()))
    reference = rows[0]["tokens"] if rows else []
    summary = []
    for row in rows:
        same = sum(a == b for a, b in zip(row.pop("tokens"), reference, strict=True))
        summary.append({**row, "identical_to_first": f"{same}/{len(reference)}"})
    (out / "engines_start.json").write_text(json.dumps(summary, indent=1))
    print("| mode | start s | most at once | builds (s from the first) | GPU blocks | req/s | identical |")
    print("|---|---|---|---|---|---|---|")
    for row in summary:
        print(
            f"| {row['mode']} | {row['start_s']:.1f} | {_overlapping(row['builds'])} | {row['builds']} | "
            f"{row['gpu_blocks']} | {row['req_per_s']:.0f} | {row['identical_to_first']} |"
        )
    return 0 if len(rows) == len(args.modes) else 1


if __name__ == "__main__":
    sys.exit(main())
