"""Throughput of the vllm adapter versus vLLM's offline LLM.generate and a plain asyncio.gather over AsyncLLM.

Every measurement runs in a fresh process (one engine each), modes interleaved round by round; the parent
prints the median of each mode and its ratio to offline as a markdown table. Only the generation is timed,
not engine start-up. Machines are noisy: compare the ratios of one run, not absolute figures.

    python benchmarks/engines/vllm_throughput.py                      # 2048 prompts x 32 tokens, 2 rounds
    python benchmarks/engines/vllm_throughput.py --rounds 3 --modes offline adapter adapter-no-uvloop

Modes:
    offline            LLM(...).generate(prompts, SamplingParams(temperature=0, max_tokens=32))
    adapter            asyncbackends.run_batch over create_backend("vllm", ...)
    adapter-no-uvloop  the same with ASYNCBACKENDS_UVLOOP=0 (plain asyncio loop)
    adapter-conc-N     the same with gather concurrency N (default: the adapter's hint)
    adapter-engine-ctx the adapter with the scheduler limits AsyncLLM gets by default (max_num_seqs=128,
                       max_num_batched_tokens=2048 on a CPU) and stats logging on
    plain              asyncio.run(asyncio.gather(*(drain(AsyncLLM.generate(...))))), AsyncLLM built with
                       vLLM's plain defaults (from_engine_args, CUMULATIVE outputs, stats logging on)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any

ENGINE_OPTIONS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 512,
    "seed": 0,
}


def _prompts(count: int) -> list[str]:
    subjects = ("the fox", "Paris", "a small model", "the answer", "water", "numbers")
    return [f"Question {i}: tell me about {subjects[i % 6]} and {i * 7 % 101}." for i in range(count)]


def _quiet_imports() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import vllm.v1.engine.async_llm  # noqa: F401


def child(mode: str, count: int, tokens: int, model: str) -> dict[str, Any]:
    _quiet_imports()
    prompts = _prompts(count)
    if mode == "offline":
        from vllm import LLM, SamplingParams

        llm = LLM(model=model, **ENGINE_OPTIONS)
        params = SamplingParams(temperature=0.0, max_tokens=tokens)
        llm.generate(prompts[:8], params, use_tqdm=False)  # warm-up, as the async modes get below
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    elif mode.startswith("adapter"):
        import asyncbackends as ab

        options = dict(ENGINE_OPTIONS)
        gather_options: dict[str, Any] = {}
        if mode == "adapter-engine-ctx":
            options.update(max_num_seqs=128, max_num_batched_tokens=2048, disable_log_stats=False)
        if mode.startswith("adapter-conc-"):
            gather_options["concurrency"] = int(mode.rsplit("-", 1)[1])
        backend = ab.create_backend("vllm", model=model, **options)
        params = ab.SamplingParams(temperature=0.0, max_tokens=tokens)
        requests = [ab.GenerationRequest(p, params) for p in prompts]
        ab.run_batch(backend, requests[:8])
        start = time.perf_counter()
        results = ab.run_batch(backend, requests, **gather_options)
        elapsed = time.perf_counter() - start
        generated = sum(r.completion_tokens for r in results)
        backend.close()
    elif mode == "plain":
        import asyncio

        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        async def run() -> tuple[float, int]:
            engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **ENGINE_OPTIONS))
            params = SamplingParams(temperature=0.0, max_tokens=tokens)

            async def one(i: int, prompt: str) -> int:
                final = None
                async for out in engine.generate(prompt, params, f"r{i}"):
                    final = out
                assert final is not None
                return len(final.outputs[0].token_ids)

            await asyncio.gather(*(one(-i - 1, p) for i, p in enumerate(prompts[:8])))
            start = time.perf_counter()
            counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
            elapsed = time.perf_counter() - start
            engine.shutdown()
            return elapsed, sum(counts)

        elapsed, generated = asyncio.run(run())
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return {"mode": mode, "seconds": elapsed, "requests": count, "generated_tokens": generated}


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--prompts", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["offline", "adapter", "plain"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", help="model directory (default: the tiny test model)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.model is None:
        from asyncbackends.testing.tiny_model import build_tiny_model

        args.model = str(build_tiny_model())
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.prompts, args.tokens, args.model)), flush=True)
        return
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
    for round_ in range(args.rounds):
        order = args.modes if round_ % 2 == 0 else list(reversed(args.modes))
        for mode in order:
            env = dict(os.environ)
            if mode == "adapter-no-uvloop":
                env["ASYNCBACKENDS_UVLOOP"] = "0"
            command = [sys.executable, __file__, "--child", mode, "--model", args.model]
            command += ["--prompts", str(args.prompts), "--tokens", str(args.tokens)]
            proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
            result = json.loads(line.removeprefix("RESULT "))
            runs[mode].append(result)
            rate = result["requests"] / result["seconds"]
            print(f"round {round_ + 1} {mode}: {rate:.0f} req/s", file=sys.stderr, flush=True)
    medians = {mode: statistics.median(r["requests"] / r["seconds"] for r in rs) for mode, rs in runs.items()}
    base = medians.get("offline")
    print(f"\n{args.prompts} prompts x {args.tokens} tokens, greedy; median of {args.rounds} rounds\n")
    print("| path | req/s (median) | generated tokens/s | each round (req/s) | vs offline |")
    print("|---|---|---|---|---|")
    for mode, results in runs.items():
        per_round = ", ".join(f"{r['requests'] / r['seconds']:.0f}" for r in results)
        tok = statistics.median(r["generated_tokens"] / r["seconds"] for r in results)
        ratio = f"{medians[mode] / base:.2f}x" if base else "-"
        print(f"| {mode} | {medians[mode]:.0f} | {tok:.0f} | {per_round} | {ratio} |")


if __name__ == "__main__":
    main()
