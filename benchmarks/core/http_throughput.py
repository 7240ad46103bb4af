"""HTTP throughput against the TGI look-alike: the tgi adapter vs the ways eval frameworks call TGI.

The look-alike runs in its own process with a fixed latency per request (20 ms by default); every contender
runs in a fresh Python process and sends the same requests at the same concurrency:

- ``asyncbackends``: the tgi adapter through ``run_batch``, retries, per-attempt timeout and progress on;
- ``hf_hub``: huggingface_hub's ``AsyncInferenceClient.text_generation`` under an ``asyncio.Semaphore``;
- ``lm_eval``: lm-eval's ``TemplateAPI`` pattern: one aiohttp session, a semaphore, a tenacity-style retry;
- ``lighteval``: lighteval's endpoint pattern: one ``asyncio.run`` per batch, batch size 1;
- ``bare``: a bare aiohttp loop with a semaphore: the practical ceiling.

Each child imports its client's modules before its clock starts (that time is reported apart: "with
imports"); its CPU seconds over the requests are reported beside the throughput.

Usage:
``python benchmarks/core/http_throughput.py [--requests 2000 --concurrency 64 --latency 0.02 --repeats 3]``.
lighteval's pattern is sequential (one request per event loop), so it gets ``--lighteval-requests``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import random
import statistics
import subprocess
import sys
import time
from typing import Any

CONTENDERS = ("bare", "asyncbackends", "hf_hub", "lm_eval", "lighteval")
# What each contender imports, timed apart from its requests: asyncbackends and its tgi adapter cost about
# 0.1 s of CPU more than aiohttp alone, 7% of a 2000-request run at 1500 req/s.
IMPORTS = {
    "bare": ("aiohttp",),
    "asyncbackends": ("asyncbackends", "asyncbackends.adapters.tgi", "tqdm.auto"),
    "hf_hub": ("huggingface_hub:AsyncInferenceClient",),  # huggingface_hub imports its names lazily
    "lm_eval": ("aiohttp",),
    "lighteval": ("huggingface_hub:AsyncInferenceClient",),
}
MAX_NEW_TOKENS = 16  # --max-new-tokens; the child's copy is set from its command line
WARMUP = 0  # --warmup: requests each child sends, untimed, before its clock starts
IDLE: float | None = None  # --idle: the asyncbackends contender's idle limit (None: a total of 30 s alone)
_timed_from: list[tuple[float, float]] = []  # (wall, CPU) when the contender's clock started


def clock_starts() -> None:
    """Called by a contender once its warm-up requests are answered: its timed span starts here."""
    _timed_from.append((time.perf_counter(), time.process_time()))


def payload(i: int) -> dict[str, Any]:
    return {
        "inputs": f"benchmark prompt number {i}",
        "parameters": {
            "do_sample": False,
            "max_new_tokens": MAX_NEW_TOKENS,
            "return_full_text": False,
            "details": True,
        },
    }


# -- contenders (each runs in its own process) ------------------------------------------------------------


def run_asyncbackends(url: str, n: int, concurrency: int) -> int:
    import asyncbackends as ab

    backend = ab.create_backend("tgi", url=url, token=False, max_connections=concurrency)
    params = ab.SamplingParams(max_tokens=MAX_NEW_TOKENS)
    # A plain 30 s is a total alone: nothing to stream for. With --idle the adapter streams its answers.
    timeout = 30.0 if IDLE is None else ab.Timeouts(total=30.0, idle=IDLE)
    options: dict[str, Any] = {"concurrency": concurrency, "retry": ab.RetryPolicy(), "timeout": timeout}
    if WARMUP:
        warm = [ab.GenerationRequest(payload(-1 - i)["inputs"], params) for i in range(WARMUP)]
        ab.run_batch(backend, warm, **options)
    clock_starts()
    requests = [ab.GenerationRequest(payload(i)["inputs"], params) for i in range(n)]
    results = ab.run_batch(backend, requests, progress=True, **options)
    backend.close()
    return sum(1 for r in results if r.text)


def run_bare(url: str, n: int, concurrency: int) -> int:
    import aiohttp

    async def main() -> int:
        sem = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(i: int) -> str:
                async with sem, session.post(url + "/generate", json=payload(i)) as resp:
                    resp.raise_for_status()
                    return str(json.loads(await resp.read())["generated_text"])

            await asyncio.gather(*(one(-1 - i) for i in range(WARMUP)))
            clock_starts()
            texts = await asyncio.gather(*(one(i) for i in range(n)))
        return sum(1 for t in texts if t)

    return asyncio.run(main())


def run_hf_hub(url: str, n: int, concurrency: int) -> int:
    from huggingface_hub import AsyncInferenceClient

    async def main() -> int:
        client = AsyncInferenceClient(base_url=url)
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> str:
            async with sem:
                out = await client.text_generation(
                    payload(i)["inputs"], max_new_tokens=MAX_NEW_TOKENS, details=True, do_sample=False
                )
                return str(out.generated_text)

        await asyncio.gather(*(one(-1 - i) for i in range(WARMUP)))
        clock_starts()
        texts = await asyncio.gather(*(one(i) for i in range(n)))
        await client.close()
        return sum(1 for t in texts if t)

    return asyncio.run(main())


async def _retrying(call: Any, attempts: int = 3) -> Any:
    # tenacity's stop_after_attempt(3) + wait_exponential(multiplier=0.5, max=10), written out by hand.
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except Exception:
            if attempt == attempts:
                raise
            await asyncio.sleep(min(10.0, 0.5 * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")


def run_lm_eval(url: str, n: int, concurrency: int) -> int:
    import aiohttp

    async def main() -> int:
        sem = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=concurrency)
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def one(i: int) -> str:
                async def call() -> Any:
                    async with session.post(url + "/generate", json=payload(i)) as resp:
                        if not resp.ok:
                            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
                        return await resp.json()

                async with sem:
                    out = await _retrying(call)
                return str(out["generated_text"])

            await asyncio.gather(*(one(-1 - i) for i in range(WARMUP)))
            clock_starts()
            texts = await asyncio.gather(*(one(i) for i in range(n)))
        return sum(1 for t in texts if t)

    return asyncio.run(main())


def run_lighteval(url: str, n: int, concurrency: int) -> int:
    from huggingface_hub import AsyncInferenceClient

    async def batch(prompts: list[str]) -> list[str]:
        # A client per asyncio.run: one kept across runs fails with "Event loop is closed" (its session is
        # bound to the first loop), the very bug the shared loop exists to avoid.
        client = AsyncInferenceClient(base_url=url)
        outs = await asyncio.gather(
            *(client.text_generation(p, max_new_tokens=MAX_NEW_TOKENS, details=True) for p in prompts)
        )
        await client.close()
        return [str(o.generated_text) for o in outs]

    for i in range(WARMUP):
        asyncio.run(batch([payload(-1 - i)["inputs"]]))
    clock_starts()
    done = 0
    for i in range(n):  # batch size 1: one asyncio.run per request, as lighteval's default does
        done += sum(1 for t in asyncio.run(batch([payload(i)["inputs"]])) if t)
    return done


# -- driver ---------------------------------------------------------------------------------------------


def start_server(latency: float) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "asyncbackends.testing.fake_tgi", "--latency", str(latency)]
    cmd += ["--max-concurrent-requests", "100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"look-alike did not start: {line!r}")
    return proc, line.removeprefix("listening on ")


def measure(name: str, url: str, n: int, concurrency: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", name, "--url", url, "--requests", str(n)]
    cmd += ["--concurrency", str(concurrency), "--max-new-tokens", str(MAX_NEW_TOKENS)]
    cmd += ["--warmup", str(WARMUP)]
    cmd += [] if IDLE is None else ["--idle", str(IDLE)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    global MAX_NEW_TOKENS, WARMUP, IDLE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--lighteval-requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--warmup", type=int, default=WARMUP, help="untimed requests first, in each child")
    parser.add_argument("--idle", type=float, help="asyncbackends' idle limit (its answers then streamed)")
    parser.add_argument("--only", nargs="*", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    MAX_NEW_TOKENS, WARMUP, IDLE = args.max_new_tokens, args.warmup, args.idle

    if args.child:
        start, cpu_start = time.perf_counter(), time.process_time()
        for module, _, name in (entry.partition(":") for entry in IMPORTS[args.child]):
            loaded = importlib.import_module(module)
            if name:
                getattr(loaded, name)  # a lazily imported name is imported on first access
        imported, cpu_imported = time.perf_counter(), time.process_time()
        ok = globals()[f"run_{args.child}"](args.url, args.requests, args.concurrency)
        timed_from, cpu_from = _timed_from[0] if _timed_from else (imported, cpu_imported)  # after warm-up
        out = {"name": args.child, "requests": args.requests, "ok": ok}
        out |= {"seconds": time.perf_counter() - timed_from, "import_seconds": imported - start}
        out |= {"cpu": time.process_time() - cpu_from, "import_cpu": cpu_imported - cpu_start}
        print(json.dumps(out))
        return

    server, url = start_server(args.latency)
    try:
        runs: dict[str, list[float]] = {name: [] for name in args.only}  # req/s, imports left out
        whole: dict[str, list[float]] = {name: [] for name in args.only}  # req/s, imports counted
        cpus: dict[str, list[float]] = {name: [] for name in args.only}
        order = list(args.only)
        for _ in range(args.repeats):
            random.shuffle(order)  # interleaved, so a noisy neighbour hurts every contender alike
            for name in order:
                n = args.lighteval_requests if name == "lighteval" else args.requests
                result = measure(name, url, n, args.concurrency)
                if result["ok"] != n:
                    raise RuntimeError(f"{name}: only {result['ok']} of {n} requests succeeded")
                runs[name].append(n / result["seconds"])
                whole[name].append(n / (result["seconds"] + result["import_seconds"]))
                cpus[name].append(result["cpu"])
    finally:
        server.terminate()
        server.wait()

    ceiling = statistics.median(runs["bare"]) if "bare" in runs else None
    ideal = args.concurrency / args.latency
    print(
        f"\n{args.requests} requests, concurrency {args.concurrency}, latency {args.latency * 1000:.0f} ms "
        f"(ideal {ideal:.0f} req/s), {MAX_NEW_TOKENS} new tokens, warm-up {WARMUP}, asyncbackends' idle "
        f"{IDLE}, median of {args.repeats} fresh processes each"
    )
    # Throughput over the requests alone (the client built and its requests sent), and over the whole child
    # with its imports; CPU: the client process's own seconds over the requests (all threads), the steadier
    # figure where other jobs share the cores.
    print("| client | req/s (median) | runs | vs bare aiohttp | with imports: req/s, vs bare | CPU s, each |")
    print("|---|---:|---|---:|---:|---|")
    whole_ceiling = statistics.median(whole["bare"]) if "bare" in whole else None
    for name in CONTENDERS:
        if name not in runs:
            continue
        med, med_whole = statistics.median(runs[name]), statistics.median(whole[name])
        ratio = f"{med / ceiling:.2f}x" if ceiling else "-"
        ratio_whole = f"{med_whole / whole_ceiling:.2f}x" if whole_ceiling else "-"
        all_runs = ", ".join(f"{r:.0f}" for r in runs[name])
        each_cpu = ", ".join(f"{c:.2f}" for c in cpus[name])
        print(f"| {name} | {med:.0f} | {all_runs} | {ratio} | {med_whole:.0f}, {ratio_whole} | {each_cpu} |")
    if "bare" in runs:
        # Each round ran every contender once, back to back: the ratio within a round is the least noisy.
        print("\nper round, vs that round's bare aiohttp process:")
        for name in CONTENDERS:
            if name in runs and name != "bare":
                pairs = ", ".join(f"{r / b:.2f}" for r, b in zip(runs[name], runs["bare"], strict=True))
                print(f"- {name}: {pairs}")


if __name__ == "__main__":
    main()
