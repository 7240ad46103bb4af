"""Replica-pool scaling on TGI look-alikes capped in concurrency: 1, 2, 4 replicas, and 4 with one killed.

Each look-alike runs in its own process and is server-bound: it serves ``--slots`` generations at a time
(16 by default), each taking ``--latency`` seconds (100 ms), and queues the rest, so one replica gives at most
``slots / latency`` requests per second (160). Every run starts fresh look-alikes and a fresh client process;
the client builds ``create_backend("pool", replicas=[...])`` with each replica's capacity set to the slots,
and sends ``slots * replicas * --per-slot`` requests through ``run_batch`` at concurrency
``--oversubscribe * slots * replicas`` (default retries): a little more than the servers serve at once, so a
short queue on each server hides the client's turnaround between one answer and the next request, as
for any server-bound client. Scenarios:

- ``single``: one replica; ``pool2``, ``pool4``: two and four;
- ``pool4_kill``: four replicas, one killed (SIGKILL) once 30 % of the requests have succeeded; every
  request must still succeed.

Targets: ``pool2 >= 0.95 x 2 x single``, ``pool4 >= 0.9 x 4 x single``, ``pool4_kill >= 0.7 x pool4``.

Usage: ``python benchmarks/core/pool_scaling.py [--repeats 3 --latency 0.1 --slots 16 --per-slot 40
--oversubscribe 1.25]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

SCENARIOS = {"single": 1, "pool2": 2, "pool4": 4, "pool4_kill": 4}
KILL_AT = 0.3


def child(urls: list[str], n: int, slots: int, concurrency: int, kill_pid: int | None) -> dict[str, Any]:
    import asyncbackends as ab

    replicas = [
        {"backend": "tgi", "url": u, "token": False, "capacity": slots, "max_connections": 4 * slots}
        for u in urls
    ]
    backend = ab.create_backend("pool", replicas=replicas)
    params = ab.SamplingParams(max_tokens=4)
    requests = [ab.GenerationRequest(f"benchmark prompt number {i}", params) for i in range(n)]
    metrics = ab.RunMetrics()
    metrics.track_replicas(backend)
    killed_at: list[float] = []

    def maybe_kill(m: ab.RunMetrics) -> None:
        if kill_pid is not None and not killed_at and m.successes >= KILL_AT * n:
            os.kill(kill_pid, signal.SIGKILL)
            killed_at.append(m.elapsed)

    metrics.on_update = maybe_kill
    cpu = time.process_time()
    start = time.perf_counter()
    results = ab.run_batch(backend, requests, concurrency=concurrency, metrics=metrics)
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    replicas_out = metrics.replicas()
    backend.close()
    ok = sum(1 for r in results if r.text)
    return {
        "replicas": len(urls),
        "requests": n,
        "concurrency": concurrency,
        "ok": ok,
        "seconds": seconds,
        "req_per_s": ok / seconds,
        "client_cpu_s": cpu,
        "retries": metrics.retries,
        "killed_at_s": killed_at[0] if killed_at else None,
        "per_replica": {
            f"r{i}": {k: v for k, v in fig.items() if k in ("requests", "successes", "failures", "cooldowns")}
            for i, fig in enumerate(replicas_out.values())
        },
    }


def start_server(latency: float, slots: int) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "asyncbackends.testing.fake_tgi", "--latency", str(latency)]
    cmd += ["--concurrency", str(slots), "--max-concurrent-requests", "100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"look-alike did not start: {line!r}")
    return proc, line.removeprefix("listening on ")


def measure(scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    count = SCENARIOS[scenario]
    servers = [start_server(args.latency, args.slots) for _ in range(count)]
    try:
        n = args.slots * count * args.per_slot
        cmd = [sys.executable, __file__, "--child", json.dumps([u for _, u in servers]), "--requests", str(n)]
        concurrency = round(args.oversubscribe * args.slots * count)
        cmd += ["--slots", str(args.slots), "--concurrency", str(concurrency)]
        if scenario.endswith("_kill"):
            cmd += ["--kill-pid", str(servers[-1][0].pid)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        result = dict(json.loads(out.stdout.strip().splitlines()[-1]))
        result["scenario"] = scenario
        return result
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--per-slot", type=int, default=40, help="requests per server slot")
    parser.add_argument("--oversubscribe", type=float, default=1.25, help="client concurrency / server slots")
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--kill-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        urls = json.loads(args.child)
        print(json.dumps(child(urls, args.requests, args.slots, args.concurrency, args.kill_pid)))
        return

    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in args.only}
    for repeat in range(args.repeats):
        for scenario in args.only:  # interleaved, so drifting machine load hits every scenario alike
            result = measure(scenario, args)
            runs[scenario].append(result)
            print(f"# repeat {repeat + 1} {json.dumps(result)}", flush=True)
    median = {s: statistics.median(r["req_per_s"] for r in rs) for s, rs in runs.items()}
    ideal = args.slots / args.latency
    print(f"\nideal per replica: {ideal:.0f} req/s ({args.slots} slots, {args.latency * 1000:.0f} ms each)")
    print("| scenario | req/s (median) | runs | ok / requests | retries |")
    print("|---|---:|---|---|---|")
    for s, rs in runs.items():
        figures = ", ".join(f"{r['req_per_s']:.1f}" for r in rs)
        oks = ", ".join(f"{r['ok']}/{r['requests']}" for r in rs)
        retries = ", ".join(str(r["retries"]) for r in rs)
        print(f"| {s} | {median[s]:.1f} | {figures} | {oks} | {retries} |")
    checks = [("pool2", "single", 2 * 0.95), ("pool4", "single", 4 * 0.9), ("pool4_kill", "pool4", 0.7)]
    for top, bottom, target in checks:
        if top in median and bottom in median:
            ratio = median[top] / median[bottom]
            verdict = "ok" if ratio >= target else "MISSED"
            print(f"{top} / {bottom}: {ratio:.2f}x (target >= {target:.2f}x) {verdict}")


if __name__ == "__main__":
    main()
