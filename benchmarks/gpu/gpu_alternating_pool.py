"""Pool ``gpu_alternating.py`` calls: the call as the unit, and each ratio split into what causes it.

Rounds of one call share one process (which CPU and which part of the GPU each engine got), so they are not
independent: two calls of the same code and command gave 0.91x and 1.10x. Here every call is one sample
(its geometric mean), and the interval is taken over calls. Each round's ratio adapter/offline is also the
product of two factors, both read from the engine core's CPU time:

- ``busy``: the adapter's engine core CPU seconds per wall second over offline's. The engine core is the
  bottleneck on both paths; a front end that fed it late or drained it late would show here, below 1.
- ``cost``: offline's engine core CPU seconds per request over the adapter's. Both engines do the same work
  for the same prompts, so this is the speed of the CPU the core ran on in that round (and anything that
  made the engine core itself do more work on one path).

    python benchmarks/gpu/gpu_alternating_pool.py benchmarks/gpu/gpu_results/alternating_eager_pin*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpu_alternating import ratio_interval


def factors(row: dict[str, Any]) -> tuple[float, float, float]:
    """A round's ratio and its two factors, busy x cost (equal to the ratio, up to rounding)."""
    offline, adapter = row["offline"], row["adapter"]
    busy = adapter["engine_core_cpu"] / offline["engine_core_cpu"]
    cost = (offline["engine_core_cpu"] * offline["seconds"]) / (
        adapter["engine_core_cpu"] * adapter["seconds"]
    )
    return row["ratio"], busy, cost


def _fmt(interval: dict[str, float]) -> str:
    return f"{interval['geomean']:.3f} ({interval['low90']:.3f}-{interval['high90']:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="alternating_*.json, one per call")
    args = parser.parse_args()
    calls: dict[str, list[tuple[str, list[tuple[float, float, float]]]]] = {}
    print("| call | prompts | rounds | ratio (90% CI in the call) | busy | cost |")
    print("|---|---|---|---|---|---|")
    for path in args.files:
        report = json.loads(path.read_text())
        for kind in ("tokens", "text"):
            timed = [r for r in report["rounds"] if r["kind"] == kind and "engine_core_cpu" in r["offline"]]
            rows = [factors(r) for r in timed]
            if not rows:
                continue
            calls.setdefault(kind, []).append((path.stem, rows))
            ratio, busy, cost = (ratio_interval([r[i] for r in rows]) for i in range(3))
            print(f"| {path.stem} | {kind} | {len(rows)} | {_fmt(ratio)} | {_fmt(busy)} | {_fmt(cost)} |")
    print()
    print("| prompts | calls | ratio, call as unit | ratio, rounds pooled | busy, pooled | cost, pooled |")
    print("|---|---|---|---|---|---|")
    for kind, entries in calls.items():
        per_call = [ratio_interval([r[0] for r in rows])["geomean"] for _, rows in entries]
        pooled = [r for _, rows in entries for r in rows]
        ratio, busy, cost = (ratio_interval([r[i] for r in pooled]) for i in range(3))
        unit = ratio_interval(per_call)
        pairs = f"{_fmt(ratio)} ({len(pooled)} pairs)"
        print(f"| {kind} | {len(entries)} | {_fmt(unit)} | {pairs} | {_fmt(busy)} | {_fmt(cost)} |")


if __name__ == "__main__":
    main()
