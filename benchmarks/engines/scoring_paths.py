"""How to ask a vLLM engine for multiple-choice loglikelihoods: the ways compared on one ``AsyncLLM``.

MMLU-shaped questions (a shared few-shot prefix, a question of its own, four one-token answers) scored:

    prompt      one request per choice, ``prompt_logprobs=0`` over the whole prompt, the prefix cache
                skipped (vLLM's default with prompt logprobs): lm-eval's ``vllm`` model's way, the reference
    token       one request per choice, ``max_tokens=1`` + ``logprob_token_ids=[choice]`` on the context
                (the prefix cache read)
    question    one request per question, ``logprob_token_ids=[A, B, C, D]`` (the adapter's grouped path)

HellaSwag-shaped ones (a short context, four endings of several tokens), with ``--endings N`` tokens each:

    prompt      as above, the reference
    cached      one request per ending, ``prompt_logprobs=0`` with ``skip_reading_prefix_cache=False``
                (the adapter's multi-token path; a hit reaching a scored row would be sent again: counted)
    steps       one request per ending token, ``max_tokens=1`` + ``logprob_token_ids=[token]`` on the
                prompt so far (every step reads the cache of the one before)

Every way runs in every round, in an order that alternates round by round, after
``reset_prefix_cache()`` (no way finds another's prompts cached). Each way's values are compared with the
reference's: the largest ``|diff|`` and how many choices' ``is_greedy`` (rank 1) and questions' argmax
differ. Prints one JSON object (every round's seconds per way, the medians, the ratios to ``prompt``), also
written to ``--out``.

    python benchmarks/engines/scoring_paths.py                       # the tiny model on the CPU
    python benchmarks/engines/scoring_paths.py --model DIR --options \
        '{"load_format": "dummy", "dtype": "bfloat16", "max_model_len": 4096}' --questions 200 --prefix 1000

(a ``1b``-shaped model directory: ``benchmarks/gpu/gpu_workload.py``'s ``build_model``.) Token ids are drawn
at random from the vocabulary (seeded), so no tokenizer round trip blurs the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

_TINY_OPTIONS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 2048,
}


def _workload(args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    rng = random.Random(args.seed)
    low = min(300, vocab // 4)

    def ids(n: int) -> list[int]:
        return [rng.randrange(low, vocab) for _ in range(n)]

    prefix = ids(args.prefix)
    mmlu = [(prefix + ids(args.question), ids(4)) for _ in range(args.questions)]
    hella = [(ids(args.context), [ids(args.endings) for _ in range(4)]) for _ in range(args.questions)]
    return {"mmlu": mmlu, "hella": hella}


class _Engine:
    def __init__(self, engine: Any) -> None:
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self.engine, self.params, self.prompt = engine, SamplingParams, TokensPrompt
        self.final = RequestOutputKind.FINAL_ONLY
        self.sent_again = 0

    async def run(self, ids: list[int], **params: Any) -> Any:
        sampling = self.params(max_tokens=1, detokenize=False, output_kind=self.final, **params)
        final = None
        async for out in self.engine.generate(self.prompt(prompt_token_ids=ids), sampling, uuid.uuid4().hex):
            final = out  # FINAL_ONLY: the one output
        return final

    async def prompt_rows(self, ids: list[int], scored: int, read_cache: bool) -> list[tuple[float, bool]]:
        cache = {"skip_reading_prefix_cache": False} if read_cache else {}
        out = await self.run(ids, prompt_logprobs=0, flat_logprobs=True, **cache)
        if read_cache and (out.num_cached_tokens or 0) > len(ids) - scored - 1:
            self.sent_again += 1
            out = await self.run(ids, prompt_logprobs=0, flat_logprobs=True)
        rows = out.prompt_logprobs
        got = []
        for position in range(len(ids) - scored, len(ids)):
            row = rows.start_indices[position]
            assert rows.token_ids[row] == ids[position]
            got.append((rows.logprobs[row], rows.ranks[row] == 1))
        return got

    async def tokens(self, ids: list[int], tokens: list[int]) -> list[tuple[float, bool]]:
        out = await self.run(ids, temperature=0.0, logprob_token_ids=tokens, flat_logprobs=True)
        completion = out.outputs[0]
        rows, sampled = completion.logprobs, completion.token_ids[0]
        start = rows.start_indices[0]
        top = rows.ranks[start] == 1
        return [(rows.logprobs[start + 1 + i], top and t == sampled) for i, t in enumerate(tokens)]


async def _way(
    engine: _Engine, shape: str, way: str, work: list[Any]
) -> list[list[list[tuple[float, bool]]]]:
    """Per question, per choice, the scored tokens' (logprob, rank 1)."""

    async def question(context: list[int], choices: list[Any]) -> list[list[tuple[float, bool]]]:
        if shape == "mmlu":
            if way == "question":
                return [[x] for x in await engine.tokens(context, choices)]
            if way == "token":
                return list(await asyncio.gather(*(engine.tokens(context, [c]) for c in choices)))
            return list(await asyncio.gather(*(engine.prompt_rows([*context, c], 1, False) for c in choices)))
        if way == "steps":

            async def ending(tokens: list[int]) -> list[tuple[float, bool]]:
                steps = [engine.tokens(context + tokens[:k], [t]) for k, t in enumerate(tokens)]
                return [step[0] for step in await asyncio.gather(*steps)]

            return list(await asyncio.gather(*(ending(e) for e in choices)))
        read = way == "cached"
        return list(await asyncio.gather(*(engine.prompt_rows(context + e, len(e), read) for e in choices)))

    return list(await asyncio.gather(*(question(c, x) for c, x in work)))


def _compare(ref: list[Any], got: list[Any]) -> dict[str, Any]:
    gap, greedy, argmax = 0.0, 0, 0
    for ref_q, got_q in zip(ref, got, strict=True):
        sums = []
        for ref_c, got_c in zip(ref_q, got_q, strict=True):
            gap = max(gap, *(abs(a[0] - b[0]) for a, b in zip(ref_c, got_c, strict=True)))
            greedy += all(t for _, t in ref_c) != all(t for _, t in got_c)
            sums.append((sum(lp for lp, _ in ref_c), sum(lp for lp, _ in got_c)))
        best = [max(range(len(sums)), key=lambda i, k=k: sums[i][k]) for k in (0, 1)]  # type: ignore[misc]
        argmax += best[0] != best[1]
    return {"max_abs_diff": gap, "is_greedy_differ": greedy, "argmax_differ": argmax}


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    options = json.loads(args.options) if args.options else dict(_TINY_OPTIONS)
    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=args.model, **options), usage_context=UsageContext.LLM_CLASS
    )
    try:
        engine = _Engine(llm)
        vocab = llm.model_config.get_vocab_size()
        work = _workload(args, vocab)
        ways = {"mmlu": ["prompt", "token", "question"], "hella": ["prompt", "cached", "steps"]}
        # Warm-up: one small round of every way, untimed.
        for shape, names in ways.items():
            for way in names:
                await _way(engine, shape, way, work[shape][:4])
        seconds: dict[str, dict[str, list[float]]] = {s: {w: [] for w in n} for s, n in ways.items()}
        values: dict[str, dict[str, Any]] = {s: {} for s in ways}
        for round_ in range(args.rounds):
            for shape, names in ways.items():
                order = names if round_ % 2 == 0 else names[::-1]
                for way in order:
                    await llm.reset_prefix_cache()
                    start = time.perf_counter()
                    values[shape][way] = await _way(engine, shape, way, work[shape])
                    seconds[shape][way].append(time.perf_counter() - start)
                    print(
                        f"round {round_ + 1} {shape} {way}: {seconds[shape][way][-1]:.3f} s", file=sys.stderr
                    )
        report: dict[str, Any] = {
            "model": args.model,
            "options": options,
            "vllm": __import__("vllm").__version__,
            "workload": {k: v for k, v in vars(args).items() if k not in ("model", "options")},
            "sent_again": engine.sent_again,
        }
        for shape, names in ways.items():
            ref = seconds[shape]["prompt"]
            report[shape] = {
                way: {
                    "seconds": seconds[shape][way],
                    "median": statistics.median(seconds[shape][way]),
                    "speedup_per_round": [a / b for a, b in zip(ref, seconds[shape][way], strict=True)],
                    **_compare(values[shape]["prompt"], values[shape][way]),
                }
                for way in names
            }
        return report
    finally:
        llm.shutdown()


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", help="model directory (default: the tiny test model)")
    parser.add_argument("--options", help="AsyncEngineArgs as JSON (default: the tiny model's CPU settings)")
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--prefix", type=int, default=900, help="MMLU shape: shared few-shot prefix tokens")
    parser.add_argument("--question", type=int, default=60, help="MMLU shape: each question's own tokens")
    parser.add_argument("--context", type=int, default=60, help="HellaSwag shape: context tokens")
    parser.add_argument("--endings", type=int, default=20, help="HellaSwag shape: tokens of each ending")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--out", help="also write the JSON here (vLLM logs to stdout too)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.model is None:
        from asyncbackends.testing.tiny_model import build_tiny_model

        args.model = str(build_tiny_model())
    report = json.dumps(asyncio.run(_main(args)), indent=1)
    print(report)
    if args.out:
        Path(args.out).write_text(report)


if __name__ == "__main__":
    main()
