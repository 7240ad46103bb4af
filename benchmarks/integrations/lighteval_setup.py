"""Engine set-up and a first small task through lighteval: `AsyncBackendsModel` (vllm) vs lighteval's own
``VLLMModel``, each in a fresh process (issue 53 item 16: "engine setup takes 3-5 s longer").

Each process times, one after the other: importing the model's module (vLLM with it), building the model
(the engine start; ours also sends the warm-up logprobs request of `create_backend`, docs/adapters/vllm.md),
then a loglikelihood task of ``--docs`` documents with four choices each (the first requests that ask for
logprobs: lighteval's own model pays vLLM's one-off ``torch.compile`` of its rank op here), then a second,
different task of the same size (both warm). Modes alternate ABBA round by round; the ratios (`RATIOS`) are
ours over lighteval's for the import and set-up together (lighteval's module imports vLLM, ours imports it
when the backend is built), for each task alone and from the process's start to the first task's results,
as geometric means with a 90 % interval; every per-process figure is printed, and the load average before
each process.

Both models get the same engine options: the tiny model, float32, ``enforce_eager``, ``max_model_len`` 512,
``gpu_memory_utilization`` 0.1, seed 1234 (lighteval's default), ``VLLM_CPU_KVCACHE_SPACE=1``, the chat
template as each decides by default (the same: the tiny tokenizer has one). lighteval 0.13 runs on vLLM 0.32
through the shims of tests/parity/_lighteval_vllm.py (its version check, a moved import, ``swap_space``, the
``generate`` spelling; none in how it starts the engine or scores).

    python benchmarks/integrations/lighteval_setup.py               # 20 documents, 2 rounds
    python benchmarks/integrations/lighteval_setup.py --docs 50 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_eval_speed import end_child, offline_model, ratio_text  # noqa: E402  (a sibling script)

MODES = ("lighteval", "ours")
ENGINE = {"dtype": "float32", "gpu_memory_utilization": 0.1, "max_model_len": 512}
PHASES = ("import", "setup", "first_task", "second_task")
RATIOS = {
    "import+setup": ("import", "setup"),  # vLLM is imported in the one phase or the other
    "first_task": ("first_task",),
    "to first results": ("import", "setup", "first_task"),  # what a run waits for, end to end
    "second_task": ("second_task",),
}
"""Each ratio's phases, summed (ours over lighteval's)."""


def _docs(count: int, offset: int) -> list[Any]:
    from lighteval.tasks.requests import Doc

    return [
        Doc(
            query=f"Question {offset + i}: what is {i} plus {offset}? Answer:",
            choices=[f" {i + offset + k}" for k in range(4)],
            gold_index=0,
            task_name="bench|0",
            id=str(offset + i),
        )
        for i in range(count)
    ]


def _lighteval_model(model: str, cache: str) -> Any:
    sys.path.insert(0, str(ROOT))
    from tests.parity._lighteval_vllm import lighteval_llm_on, vllm_model

    def start(**kwargs: Any) -> Any:
        from vllm import LLM

        llm = LLM(**{k: v for k, v in kwargs.items() if k != "swap_space"})  # vLLM 0.32 takes no swap_space
        return lighteval_llm_on(llm)(**kwargs)

    vllm_model.LLM = start
    config = vllm_model.VLLMModelConfig(
        model_name=model,
        dtype=ENGINE["dtype"],
        gpu_memory_utilization=ENGINE["gpu_memory_utilization"],
        max_model_length=ENGINE["max_model_len"],
        cache_dir=cache,
    )
    return config, vllm_model.VLLMModel


def _our_model(model: str, cache: str) -> Any:
    from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

    options = {"model": model, "enforce_eager": True, "seed": 1234, **ENGINE}
    config = AsyncBackendsModelConfig(
        model_name="tiny", backend="vllm", backend_options=options, cache_dir=cache, progress=False
    )
    return config, AsyncBackendsModel


def child(mode: str, model: str, docs: int) -> dict[str, Any]:
    """One process's figures: seconds per phase, and the first task's logprobs (to compare the two)."""
    import warnings

    warnings.simplefilter("ignore")
    times: dict[str, float] = {}
    cache = tempfile.mkdtemp(prefix="lighteval-cache-")
    start = time.perf_counter()
    config, model_class = (_lighteval_model if mode == "lighteval" else _our_model)(model, cache)
    times["import"] = time.perf_counter() - start
    start = time.perf_counter()
    lm = model_class(config)
    times["setup"] = time.perf_counter() - start
    logprobs = []
    for phase, offset in (("first_task", 0), ("second_task", docs)):
        start = time.perf_counter()
        responses = lm.loglikelihood(_docs(docs, offset))
        times[phase] = time.perf_counter() - start
        logprobs.extend(r.logprobs for r in responses)
    return {"times": times, "logprobs": logprobs}


def _run_child(mode: str, model: str, docs: int, out: Path) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--model", model]
    command += ["--docs", str(docs), "--out", str(out)]
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return dict(json.loads(out.read_text()))


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--docs", type=int, default=20, help="documents per task (4 choices each)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default=None, help="a local model (default: the tiny model)")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = offline_model(args.model)
    if args.child:
        args.out.write_text(json.dumps(child(args.child, model, args.docs)))
        end_child()

    folder = Path(tempfile.mkdtemp(prefix="lighteval-setup-"))
    ratios: dict[str, list[float]] = {name: [] for name in RATIOS}
    gap = 0.0
    for round_ in range(args.rounds):
        order = MODES if round_ % 2 == 0 else MODES[::-1]
        figures = {}
        for mode in order:
            load = os.getloadavg()[0]
            figures[mode] = _run_child(mode, model, args.docs, folder / f"{mode}-{round_}.json")
            times = figures[mode]["times"]
            shown = "  ".join(f"{phase} {times[phase]:6.2f} s" for phase in PHASES)
            print(f"round {round_ + 1} {mode:9}  load {load:5.2f}  {shown}", flush=True)
        ours, theirs = figures["ours"]["times"], figures["lighteval"]["times"]
        for name, phases in RATIOS.items():
            ratios[name].append(sum(ours[p] for p in phases) / sum(theirs[p] for p in phases))
        pairs = zip(figures["ours"]["logprobs"], figures["lighteval"]["logprobs"], strict=True)
        for mine, reference in pairs:
            gap = max(gap, *(abs(a - b) for a, b in zip(mine, reference, strict=True)))
    load = os.getloadavg()[0]
    print(f"ours / lighteval's own VLLMModel ({args.docs} documents a task, load {load:.2f} now):")
    for name, values in ratios.items():
        print(f"  {name:16} {ratio_text(values)}  (rounds: {', '.join(f'{v:.3f}' for v in values)})")
    print(f"largest loglikelihood gap between the two: {gap:.2e}")


if __name__ == "__main__":
    main()
