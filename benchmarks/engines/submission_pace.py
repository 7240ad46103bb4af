"""How fast requests reach the engine, and how many engine steps a round takes: adapter vs offline (CPU).

Both engines in one process (the tiny CPU model, or ``--model``), rounds alternating on fresh prompts, as
``gpu_alternating.py`` does on the GPU. For each path the engine-core client's own calls are timed: every
request sent to the engine core (``add_request`` offline, ``add_request_async`` for the adapter, vLLM's
calls underneath both paths) and every batch of outputs received from it, one per engine step. Printed per
round and path: when the first and last requests were sent (seconds from the call's start and as a share
of the round), when the first output came back, and how many output batches (engine steps) the round took.

Equal step counts mean the engine core did the same scheduling work on both paths; if the adapter sent its
requests later than offline does, the engine's first steps would run on fewer requests and the round would
need more steps for the same tokens.

    python benchmarks/engines/submission_pace.py           # 4096 token-id prompts x 32 tokens, 4 rounds
    python benchmarks/engines/submission_pace.py --prompt-kind text --count 2048
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

from gpu_alternating import scheduler_of


class Clock:
    """Times of the calls a path makes to its engine-core client, since the round started."""

    def __init__(self) -> None:
        self.start = 0.0
        self.sent: list[float] = []
        self.received: list[float] = []

    def reset(self) -> None:
        self.start = time.perf_counter()
        self.sent.clear()
        self.received.clear()

    def wrap_sync(self, client: Any) -> None:
        add, get = client.add_request, client.get_output

        def add_request(request: Any) -> None:
            add(request)
            self.sent.append(time.perf_counter() - self.start)

        def get_output() -> Any:
            outputs = get()
            if outputs.outputs:
                self.received.append(time.perf_counter() - self.start)
            return outputs

        client.add_request, client.get_output = add_request, get_output

    def wrap_async(self, client: Any) -> None:
        add, get = client.add_request_async, client.get_output_async

        async def add_request_async(request: Any) -> None:
            await add(request)
            self.sent.append(time.perf_counter() - self.start)

        async def get_output_async() -> Any:
            outputs = await get()
            if outputs.outputs:
                self.received.append(time.perf_counter() - self.start)
            return outputs

        client.add_request_async, client.get_output_async = add_request_async, get_output_async

    def figures(self, took: float) -> dict[str, Any]:
        sent = sorted(self.sent)
        return {
            "seconds": round(took, 3),
            "first_sent_s": round(sent[0], 4),
            "half_sent_s": round(sent[len(sent) // 2], 4),
            "all_sent_s": round(sent[-1], 4),
            "all_sent_share": round(sent[-1] / took, 4),
            "first_output_s": round(min(self.received), 4),
            "engine_steps": len(self.received),
        }


def _prompts(count: int, seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(8, 64))] for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4, help="rounds per path, ABBA order (even)")
    parser.add_argument("--prompt-kind", choices=["tokens", "text"], default="tokens")
    parser.add_argument("--model", help="model directory (default: the tiny test model)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from vllm import LLM, SamplingParams, TokensPrompt

    import asyncbackends as ab
    from asyncbackends.testing.tiny_model import build_tiny_model

    model = args.model or str(build_tiny_model())
    options = {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.1, "max_model_len": 512}
    # The scheduler settings both engines read back on the H200 (the CPU's defaults are smaller): the
    # adapter's concurrency hint follows max_num_seqs (4 x 1024), so every request is in flight at once.
    options.update(max_num_seqs=1024, max_num_batched_tokens=16384)
    llm = LLM(model=model, seed=0, **options)
    backend = ab.create_backend("vllm", model=model, seed=0, **options)
    tokenizer = llm.get_tokenizer()
    vocab = min(len(tokenizer), 200)  # ids the tiny tokenizer decodes to text and back
    greedy = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    params = ab.SamplingParams(max_tokens=args.tokens, temperature=0.0)
    clocks = {"offline": Clock(), "adapter": Clock()}
    clocks["offline"].wrap_sync(llm.llm_engine.engine_core)
    ab.run_batch(backend, [ab.GenerationRequest((5, 6, 7), params)])  # starts the engine
    engine = backend._engine  # type: ignore[attr-defined]  # read back and timed, not used to run
    clocks["adapter"].wrap_async(engine.engine_core)

    def as_text(batch: list[list[int]]) -> list[str]:
        return [tokenizer.decode(p) for p in batch]

    def offline(batch: list[list[int]]) -> int:
        tokens = args.prompt_kind == "tokens"
        inputs: list[Any] = [TokensPrompt(prompt_token_ids=p) for p in batch] if tokens else as_text(batch)
        outputs = llm.generate(inputs, greedy, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    def adapter(batch: list[list[int]]) -> int:
        inputs: list[Any] = [tuple(p) for p in batch] if args.prompt_kind == "tokens" else as_text(batch)
        results = ab.run_batch(backend, [ab.GenerationRequest(p, params) for p in inputs])
        return sum(r.completion_tokens for r in results)

    paths = {"offline": offline, "adapter": adapter}
    for run in paths.values():
        run(_prompts(16, 1, vocab))
    rows: list[dict[str, Any]] = []
    rounds = args.rounds + args.rounds % 2
    for index in range(rounds):
        batch = _prompts(args.count, 100 + index, vocab)
        order = ["offline", "adapter"] if index % 2 == 0 else ["adapter", "offline"]
        for name in order:
            clocks[name].reset()
            tokens = paths[name](batch)
            took = time.perf_counter() - clocks[name].start
            row = {"round": index, "path": name, "tokens": tokens, **clocks[name].figures(took)}
            rows.append(row)
            print("RESULT " + json.dumps(row), flush=True)
    summary = {}
    for name in paths:
        mine = [r for r in rows if r["path"] == name]
        summary[name] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("all_sent_s", "all_sent_share", "first_output_s", "engine_steps", "seconds")
        }
    print("SUMMARY " + json.dumps(summary), flush=True)
    print("SCHEDULER " + json.dumps({"offline": scheduler_of(llm), "adapter": scheduler_of(engine)}))
    del engine  # the backend shuts its engine down; a reference left here would outlive the interpreter
    backend.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
