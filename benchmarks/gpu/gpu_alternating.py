"""The vllm adapter against vLLM's offline ``LLM.generate`` in ONE process, rounds alternating (GPU).

Fresh processes one after another (``gpu_throughput.py``) leave machine drift between the two paths: on a
shared H200, offline rounds of one process spread by up to 24%, more than the effect measured. Here one
process holds both engines on the same GPU, each with part of its memory, and runs rounds in the order
offline, adapter, adapter, offline, ... (ABBA), each round on prompts neither engine has seen (no prefix
cache hits), so drift falls on both paths alike. The figure is the paired ratio adapter/offline per round:
its geometric mean, a 90% confidence interval (Student's t on the log ratios), and each path's spread.

The offline engine is built as an independent measurement was (``max_num_seqs=1024,
max_num_batched_tokens=16384``); the adapter gets only what a user must give (model, load_format,
max_model_len, enforce_eager) plus ``gpu_memory_utilization`` (two engines share the GPU); both engines'
scheduler settings are read back from the running engines and reported. ``run_batch`` runs with its
defaults. Run on the GPU machine:

    python benchmarks/gpu/gpu_alternating.py --model-dir /tmp/synth-1b --mode eager --prompt-kind tokens --pin

``--pin`` puts both engine cores' busy loops on one CPU, their other threads on a second and the caller on
the rest, so that where the OS placed each core process is no longer a difference between the paths (see
``pinning_plan``; on the H200 it did not narrow the spread: docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

for _name, _value in {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_name, _value)

from gpu_workload import build_model, generation_prompts, log  # noqa: E402

# Student's t quantiles for a two-sided 90% interval (0.95 one-sided), by degrees of freedom.
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833,
        10: 1.812, 11: 1.796, 12: 1.782, 13: 1.771, 14: 1.761, 15: 1.753, 16: 1.746, 17: 1.740,
        18: 1.734, 19: 1.729, 20: 1.725}  # fmt: skip


def ratio_interval(ratios: list[float]) -> dict[str, float]:
    """Geometric mean of paired ratios and its two-sided 90% interval (t on the logs)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return {"geomean": math.exp(mean), "low90": float("nan"), "high90": float("nan")}
    half = _T95.get(len(logs) - 1, 1.645) * statistics.stdev(logs) / math.sqrt(len(logs))
    return {"geomean": math.exp(mean), "low90": math.exp(mean - half), "high90": math.exp(mean + half)}


def spread(rates: list[float]) -> float:
    """Coefficient of variation of a path's per-round rates."""
    return statistics.stdev(rates) / statistics.fmean(rates) if len(rates) > 1 else 0.0


def scheduler_of(engine: Any) -> dict[str, Any]:
    """The scheduler settings a running engine ended up with (LLM or AsyncLLM)."""
    config = getattr(engine, "vllm_config", None)
    if config is None:
        config = engine.llm_engine.vllm_config
    sched = config.scheduler_config
    return {"max_num_seqs": sched.max_num_seqs, "max_num_batched_tokens": sched.max_num_batched_tokens}


def _children() -> set[int]:
    import psutil

    return {child.pid for child in psutil.Process().children(recursive=True)}


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) used so far by these processes (the engine's core)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _gc_counts() -> list[int]:
    return [entry["collections"] for entry in gc.get_stats()]


def _gc_clock() -> Any:
    """Start timing the garbage collector; returns a function giving the seconds spent collecting so far."""
    spent = [0.0, 0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            spent[1] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - spent[1]

    gc.callbacks.append(callback)
    return lambda: spent[0]


def _cpu_list(text: str) -> set[int]:
    """Parse a kernel CPU list such as ``0-3,8``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def pinning_plan(allowed: set[int]) -> dict[str, list[int]]:
    """CPUs for the engines' core processes (the same ones for both) and for the caller's process.

    The engine core's Python loop is the bottleneck on both paths (about one CPU second per second), so a
    round's rate is the speed of the CPU its busy loop runs on: the core's CPU time per request, the same
    work on both paths, varied by 2x between rounds of earlier calls. A core process that settles on a
    slower or busier CPU for its whole life is a per-process difference between the paths that alternating
    rounds cannot take out. So the busy loop of both cores (their main thread) gets one CPU, the cores'
    other threads (sockets, copies) a second, each on a physical core of its own whose SMT siblings stay
    idle, and the caller every other physical core. Only one path runs at a time, so the two cores never
    share the CPU at once.
    """
    groups: dict[frozenset[int], None] = {}
    for cpu in sorted(allowed):
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            siblings = frozenset(_cpu_list(path.read_text()) & allowed) or frozenset({cpu})
        except OSError:
            siblings = frozenset({cpu})
        groups[siblings] = None
    cores = list(groups)
    if len(cores) < 3:
        raise SystemExit(f"--pin needs at least 3 physical cores, found {len(cores)}")
    return {
        "engine_loop": [min(cores[-1])],
        "engine_other": [min(cores[-2])],
        "frontend": sorted(cpu for group in cores[:-2] for cpu in group),
        "physical_cores": [sorted(group) for group in cores],
    }


def pin_process(pid: int, cpus: list[int], main_cpus: list[int] | None = None) -> int:
    """Pin every thread of a process (``sched_setaffinity`` acts on one thread); returns how many.

    With ``main_cpus``, the main thread (whose id is the process id) goes there and the others to ``cpus``.
    Threads started later inherit the affinity of the thread that starts them.
    """
    pinned = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        tid = int(task)
        try:
            os.sched_setaffinity(tid, main_cpus if main_cpus is not None and tid == pid else cpus)
            pinned += 1
        except (ProcessLookupError, PermissionError):
            continue  # a thread that ended meanwhile
    return pinned


def last_cpu(pid: int) -> int | None:
    """The CPU a process's main thread last ran on (field 39 of /proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[36])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--mode", choices=["eager", "compiled"], default="eager")
    parser.add_argument(
        "--prompt-kind",
        default="tokens",
        help="tokens, text, or tokens,text: both kinds in one process (each round runs every kind's pair)",
    )
    parser.add_argument("--rounds", type=int, default=8, help="ABBA rounds per path (even)")
    parser.add_argument("--count", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=32)
    parser.add_argument("--gpu-share", type=float, default=0.42, help="gpu_memory_utilization of each engine")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--tag", default="")
    parser.add_argument(
        "--gc-off",
        action="store_true",
        help="disable Python's collector during each timed run (both paths): is the gap the collector?",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="both engine cores' busy loops on one CPU, the caller on others (pinning_plan says why)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    build_model(args.model_dir)

    from vllm import LLM, SamplingParams, TokensPrompt

    import asyncbackends as ab

    eager = args.mode == "eager"
    common = {"load_format": "dummy", "max_model_len": args.max_model_len, "enforce_eager": eager}
    model = str(args.model_dir)
    began = time.perf_counter()
    llm = LLM(
        model=model,
        gpu_memory_utilization=args.gpu_share,
        max_num_seqs=1024,
        max_num_batched_tokens=16384,
        **common,
    )
    log(f"offline engine ready in {time.perf_counter() - began:.1f}s")
    offline_children = _children()
    began = time.perf_counter()
    backend = ab.create_backend("vllm", model=model, gpu_memory_utilization=args.gpu_share, **common)
    log(f"adapter engine ready in {time.perf_counter() - began:.1f}s")
    engine_pids = {"offline": sorted(offline_children), "adapter": sorted(_children() - offline_children)}
    log("engine processes", engine_pids)
    pinning: dict[str, Any] = {}
    if args.pin:
        pinning = pinning_plan(os.sched_getaffinity(0))
        threads = {"frontend": pin_process(os.getpid(), pinning["frontend"])}
        for name, pids in engine_pids.items():
            pinned = (pin_process(pid, pinning["engine_other"], pinning["engine_loop"]) for pid in pids)
            threads[name] = sum(pinned)
        pinning["threads_pinned"] = threads
        log("pinned", pinning)
    tokenizer = llm.get_tokenizer()
    vocab = len(tokenizer)
    rounds = args.rounds + (args.rounds % 2)
    # One fresh prompt set per round, used once by each path: neither engine sees a prompt twice.
    sets = [generation_prompts(args.count, vocab, seed=100 + i) for i in range(rounds)]
    warm = generation_prompts(args.warmup, vocab, seed=99)

    def as_text(batch: list[list[int]]) -> list[str]:
        return [tokenizer.decode(p, skip_special_tokens=True) for p in batch]

    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    params = ab.SamplingParams(max_tokens=args.max_tokens, temperature=0.0)

    kinds = args.prompt_kind.split(",")
    if not set(kinds) <= {"tokens", "text"}:
        parser.error("--prompt-kind: tokens, text or tokens,text")

    def offline(batch: list[list[int]], kind: str) -> tuple[float, list[list[int]]]:
        prompts: Any = as_text(batch) if kind == "text" else [TokensPrompt(prompt_token_ids=p) for p in batch]
        start = time.perf_counter()
        outputs = llm.generate(prompts, greedy, use_tqdm=False)
        took = time.perf_counter() - start
        return took, [list(o.outputs[0].token_ids) for o in outputs]

    def adapter(batch: list[list[int]], kind: str) -> tuple[float, list[list[int]]]:
        prompts: list[Any] = as_text(batch) if kind == "text" else [tuple(p) for p in batch]
        requests = [ab.GenerationRequest(p, params) for p in prompts]
        start = time.perf_counter()
        results = ab.run_batch(backend, requests)
        took = time.perf_counter() - start
        return took, [list(r.completions[0].token_ids) for r in results]

    paths = {"offline": offline, "adapter": adapter}
    for run in paths.values():
        for kind in kinds:
            run(warm, kind)
    gc_time = _gc_clock()
    engine = backend._engine  # type: ignore[attr-defined]  # read back, not used to run
    report: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "scheduler": {"offline": scheduler_of(llm), "adapter": scheduler_of(engine)},
        "pinning": pinning,
        "rounds": [],
    }
    log("scheduler settings", report["scheduler"])
    for index in range(rounds):
        order = ["offline", "adapter"] if index % 2 == 0 else ["adapter", "offline"]
        for kind in kinds:
            row: dict[str, Any] = {"round": index, "kind": kind, "order": order, "load": os.getloadavg()[0]}
            outputs = {}
            for name in order:
                gc.collect()
                before = _cpu(engine_pids[name]), time.process_time(), gc_time(), _gc_counts()
                if args.gc_off:
                    gc.disable()
                try:
                    took, tokens = paths[name](sets[index], kind)
                finally:
                    gc.enable()
                after = _cpu(engine_pids[name]), time.process_time(), gc_time(), _gc_counts()
                row[name] = {
                    "seconds": took,
                    "req_s": len(tokens) / took,
                    "tok_s": sum(map(len, tokens)) / took,
                    # CPU seconds per wall second: the caller's process (every thread: the shared loop too),
                    # and the engine's core process; GC: seconds collecting and collections by generation.
                    "frontend_cpu": (after[1] - before[1]) / took,
                    "engine_core_cpu": (after[0] - before[0]) / took,
                    # The same work on both paths: CPU time per request is the speed of the CPU it ran on.
                    "engine_core_ms_per_request": (after[0] - before[0]) / len(tokens) * 1000,
                    "engine_main_thread_cpu": {pid: last_cpu(pid) for pid in engine_pids[name]},
                    "gc_seconds": after[2] - before[2],
                    "gc_collections": [a - b for a, b in zip(after[3], before[3], strict=True)],
                }
                outputs[name] = tokens
            row["ratio"] = row["adapter"]["req_s"] / row["offline"]["req_s"]
            pairs = zip(outputs["offline"], outputs["adapter"], strict=True)
            row["identical"] = sum(a == b for a, b in pairs)
            report["rounds"].append(row)
            rates = ", ".join(f"{n} {row[n]['req_s']:.1f} req/s" for n in ("offline", "adapter"))
            cpu = " ".join(
                f"{n} fe {row[n]['frontend_cpu']:.2f} core {row[n]['engine_core_cpu']:.2f} "
                f"({row[n]['engine_core_ms_per_request']:.2f} ms/req) "
                f"gc {row[n]['gc_seconds']:.2f}s"
                for n in order
            )
            same = row["identical"]
            log(f"round {index} {kind} {order}: {rates}, ratio {row['ratio']:.3f}, identical {same}")
            log(f"  cpu/s {cpu}")
            (args.out / f"alternating{args.tag}.json").write_text(json.dumps(report, indent=1))
    report["summary"] = {}
    for kind in kinds:
        rows = [r for r in report["rounds"] if r["kind"] == kind]
        ratios = [r["ratio"] for r in rows]
        report["summary"][kind] = {
            **ratio_interval(ratios),
            "ratios": ratios,
            "offline_req_s": [r["offline"]["req_s"] for r in rows],
            "adapter_req_s": [r["adapter"]["req_s"] for r in rows],
            "offline_cv": spread([r["offline"]["req_s"] for r in rows]),
            "adapter_cv": spread([r["adapter"]["req_s"] for r in rows]),
        }
    log("summary", json.dumps(report["summary"]))
    (args.out / f"alternating{args.tag}.json").write_text(json.dumps(report, indent=1))
    backend.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    random.seed(0)
    main()
