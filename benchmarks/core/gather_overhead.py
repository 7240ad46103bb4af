"""Gathering overhead: 100k requests to an instant backend, side by side, fresh processes, interleaved.

Modes (each in its own process, rounds interleaved, median reported):
- ``bare``: ``asyncio.gather`` over 100k coroutines of the backend's ``generate`` (one task each), on the
  shared loop: the reference.
- ``semaphore``: the lm-eval pattern: ``asyncio.gather`` over coroutines that each take an
  ``asyncio.Semaphore(64)``.
- ``run_batch``: ``ab.run_batch`` with a retry policy and a per-attempt timeout set (concurrency 64).

Peak memory growth is the process's max RSS after the run minus before it (requests built first, so both
sides hold the same inputs). Usage: ``python benchmarks/core/gather_overhead.py [--n 100000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time

MODES = ("bare", "semaphore", "run_batch")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(mode: str, n: int) -> dict[str, float]:
    import asyncbackends as ab

    class Instant(ab.BaseBackend):
        name = "instant"
        capabilities = ab.Capabilities()

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            await asyncio.sleep(0)
            return ab.GenerationResult(request.request_id, ())

    backend = Instant()
    requests = [ab.GenerationRequest("x") for _ in range(n)]
    manager = ab.get_loop_manager()
    manager.run(asyncio.sleep(0))  # start the loop outside the timed region
    before = _rss_mb()
    start = time.perf_counter()
    if mode == "bare":

        async def bare() -> list[object]:
            return await asyncio.gather(*(backend.generate(r) for r in requests))

        results = manager.run(bare())
    elif mode == "semaphore":

        async def semaphore() -> list[object]:
            sem = asyncio.Semaphore(64)

            async def limited(r: ab.GenerationRequest) -> object:
                async with sem:
                    return await backend.generate(r)

            return await asyncio.gather(*(limited(r) for r in requests))

        results = manager.run(semaphore())
    else:
        results = ab.run_batch(
            backend, requests, concurrency=64, retry=ab.RetryPolicy(max_attempts=3), timeout=30.0
        )
    elapsed = time.perf_counter() - start
    assert len(results) == n
    return {"seconds": elapsed, "rss_growth_mb": _rss_mb() - before}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=MODES)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.n)))
        return
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:  # interleaved: noise on a shared machine hits every mode alike
            out = subprocess.run(
                [sys.executable, __file__, "--one", mode, "--n", str(args.n)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    bare = statistics.median(r["seconds"] for r in runs["bare"])
    print(f"{args.n} requests to an instant backend, median of {args.rounds} interleaved rounds\n")
    print("| mode | us/request | vs bare gather | peak RSS growth (MB) | us/request, every process |")
    print("|---|---|---|---|---|")
    for mode in MODES:
        seconds = statistics.median(r["seconds"] for r in runs[mode])
        rss = statistics.median(r["rss_growth_mb"] for r in runs[mode])
        each = ", ".join(f"{r['seconds'] / args.n * 1e6:.1f}" for r in runs[mode])
        print(f"| {mode} | {seconds / args.n * 1e6:.1f} | {bare / seconds:.2f}x | {rss:.0f} | {each} |")


if __name__ == "__main__":
    main()
