"""Objects promoted to Python's oldest GC generation per request: vllm adapter vs vLLM's offline LLM.generate.

A request in flight keeps its objects alive across young collections, so they are promoted to the oldest
generation; when promotions since the last full collection pass a quarter of that generation's size,
CPython collects the whole heap (half a second in a GPU host's vLLM front end). This script counts, in one
process holding both engines on the tiny CPU model, how many objects each path promotes per request in a
round, and which types they are (sampled from the young generations at each generation-1 collection).

    python benchmarks/engines/gc_promotions.py                 # 4096 prompts x 32 tokens, 2 rounds
    python benchmarks/engines/gc_promotions.py --count 2048 --rounds 1

Counting slows the round down (it lists the oldest generation twice per generation-1 collection): the
times printed are not throughput figures.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import random
import time
import warnings
from typing import Any

_state: dict[str, Any] = {"on": False}


def _callback(phase: str, info: dict[str, int]) -> None:
    if not _state["on"] or info["generation"] != 1:
        return
    if phase == "start":
        for generation in (0, 1):
            _state["types"].update(type(o).__name__ for o in gc.get_objects(generation))
        _state["oldest"] = len(gc.get_objects(2))
    else:
        _state["promoted"] += len(gc.get_objects(2)) - _state["oldest"]


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 200) for _ in range(rng.randrange(8, 64))] for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", help="model directory (default: the tiny test model)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from vllm import LLM, SamplingParams, TokensPrompt

    import asyncbackends as ab
    from asyncbackends.testing.tiny_model import build_tiny_model

    model = args.model or str(build_tiny_model())
    options = {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.1, "max_model_len": 512}
    llm = LLM(model=model, max_num_seqs=1024, max_num_batched_tokens=16384, seed=0, **options)
    backend = ab.create_backend("vllm", model=model, seed=0, **options)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    params = ab.SamplingParams(max_tokens=args.tokens, temperature=0.0)

    def offline(batch: list[list[int]]) -> Any:
        return llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], greedy, use_tqdm=False)

    def adapter(batch: list[list[int]]) -> Any:
        return ab.run_batch(backend, [ab.GenerationRequest(tuple(p), params) for p in batch])

    paths = {"offline": offline, "adapter": adapter}
    for run in paths.values():
        run(_prompts(16, 1))
    gc.callbacks.append(_callback)
    for index in range(args.rounds):
        for name, run in paths.items():
            batch = _prompts(args.count, 100 + index)
            gc.collect()
            oldest = len(gc.get_objects(2))
            _state.update(on=True, promoted=0, types=collections.Counter())
            before = [s["collections"] for s in gc.get_stats()]
            start = time.perf_counter()
            run(batch)
            took = time.perf_counter() - start
            _state["on"] = False
            after = [s["collections"] for s in gc.get_stats()]
            row = {
                "round": index,
                "path": name,
                "oldest_generation": oldest,
                "promoted": _state["promoted"],
                "promoted_per_request": round(_state["promoted"] / args.count, 1),
                "collections": [a - b for a, b in zip(after, before, strict=True)],
                "seconds_while_counting": round(took, 2),
                "young_types": _state["types"].most_common(20),
            }
            print("RESULT " + json.dumps(row), flush=True)
    backend.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
