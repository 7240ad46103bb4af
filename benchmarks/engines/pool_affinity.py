"""Affinity routing against least-loaded routing on two real vLLM replicas, few-shot-style workload.

Two in-process engines on the tiny test model (``asyncbackends.testing.tiny_model``), prefix caching on,
behind one pool each way: ``routing="affinity"`` and ``routing="least_loaded"`` over the same two engines.
The workload is few-shot shaped: ``--prefixes`` long shared prefixes (the shots), each followed by
``--questions`` short questions, sent interleaved (consecutive requests have different prefixes), greedy,
``--max-tokens`` generated. Before each measured pass both engines' prefix caches are reset; passes
alternate between the two routings for ``--rounds`` rounds. Only the pass is timed, not engine start-up.
Each pass also reports its cached prompt share (`RunMetrics.cached_prompt_tokens` over `prompt_tokens`, the
engines' own ``num_cached_tokens``): what a provider that bills cached tokens apart would charge less for.

Usage: ``VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/engines/pool_affinity.py [--rounds 2 --prefixes 6]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

ENGINE_OPTIONS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 2048,
    "seed": 0,
    "enable_prefix_caching": True,
}


def workload(prefixes: int, questions: int, shot_chars: int, max_tokens: int) -> list[Any]:
    import asyncbackends as ab

    shots = []
    for p in range(prefixes):
        lines, i = [], 0
        while sum(len(x) for x in lines) < shot_chars:
            lines.append(f"Task {p} example {i}: what follows {i * 7 + p}? It is {i * 7 + p + 1}.\n")
            i += 1
        shots.append("".join(lines))
    params = ab.SamplingParams(max_tokens=max_tokens)
    return [
        ab.GenerationRequest(shots[p] + f"Question {q}: what follows {q * 3 + p}? It is", params)
        for q in range(questions)
        for p in range(prefixes)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prefixes", type=int, default=6)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--shot-chars", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    import asyncbackends as ab
    from asyncbackends.testing.tiny_model import build_tiny_model

    model = str(build_tiny_model())
    engines = [ab.create_backend("vllm", model=model, **ENGINE_OPTIONS) for _ in range(2)]
    requests = workload(args.prefixes, args.questions, args.shot_chars, args.max_tokens)
    manager = ab.get_loop_manager()

    async def reset() -> None:
        await asyncio.gather(*(e.engine.reset_prefix_cache() for e in engines))  # type: ignore[attr-defined]

    runs: dict[str, list[dict[str, Any]]] = {"least_loaded": [], "affinity": []}
    ab.run_batch(engines[0], requests[:2])  # warm both engines' code paths once, outside the timing
    ab.run_batch(engines[1], requests[:2])
    for _ in range(args.rounds):
        for routing in runs:
            pool = ab.pool(engines, routing=routing)
            manager.run(reset())
            metrics = ab.RunMetrics()
            metrics.track_replicas(pool)
            start = time.perf_counter()
            results = ab.run_batch(pool, requests, concurrency=args.concurrency, metrics=metrics)
            seconds = time.perf_counter() - start
            split = [fig["requests"] for fig in metrics.replicas().values()]
            run = {
                "routing": routing,
                "seconds": seconds,
                "req_per_s": len(results) / seconds,
                "split": split,
                "cached_share": metrics.cached_prompt_tokens / max(1, metrics.prompt_tokens),
            }
            runs[routing].append(run)
            print("#", json.dumps(run), flush=True)
            manager.run(pool.router.aclose())  # the engines are shared by the next pool: not closed here
    for engine in engines:
        engine.close()  # type: ignore[attr-defined]
    median = {r: statistics.median(x["req_per_s"] for x in rs) for r, rs in runs.items()}
    print(
        f"\n{len(requests)} requests: {args.prefixes} prefixes of ~{args.shot_chars} chars x {args.questions}"
    )
    print("| routing | req/s (median) | runs | requests per replica | cached prompt share |")
    print("|---|---:|---|---|---|")
    for routing, rs in runs.items():
        figures = ", ".join(f"{x['req_per_s']:.1f}" for x in rs)
        splits = "; ".join("/".join(map(str, x["split"])) for x in rs)
        shares = ", ".join(f"{x['cached_share']:.1%}" for x in rs)
        print(f"| {routing} | {median[routing]:.1f} | {figures} | {splits} | {shares} |")
    print(f"affinity / least_loaded: {median['affinity'] / median['least_loaded']:.2f}x")


if __name__ == "__main__":
    main()
