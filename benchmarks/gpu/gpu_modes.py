"""The modes of ``gpu_throughput.py``: each runs in its own process and reports its timings as JSON.

Every mode times only the work (not engine start-up) after a 64-request warm-up, and also the frontend
process's CPU seconds over that time (all its threads; the engine core is another process): a ratio near
1.0 says the Python side, not the GPU, sets the pace.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from gpu_workload import generation_prompts, log, scoring_pairs


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """What a user must give for this model; the same for every mode."""
    options = {
        "dtype": args.dtype,
        "load_format": "dummy",
        "max_model_len": args.max_model_len,
        "enforce_eager": not args.compiled,
    }
    extra: dict[str, Any] = json.loads(args.engine_extra)
    return options | extra


def _offline(
    args: argparse.Namespace, prompts: list[list[int]], pairs: list[tuple[str, str]]
) -> dict[str, Any]:
    from vllm import LLM, SamplingParams, TokensPrompt

    from asyncbackends.adapters._scoring import plan_loglikelihood

    start = time.perf_counter()
    llm = LLM(model=args.model_dir, **engine_options(args))
    result: dict[str, Any] = {"init_s": time.perf_counter() - start}
    log(f"offline engine ready in {result['init_s']:.1f}s")
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts[:64]], greedy, use_tqdm=False)
    runs = []
    profiler = _start_profiler("offline-generate")
    for batch in [prompts, *extra_rounds(args)]:
        began = _clock()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], greedy, use_tqdm=False)
        runs.append(_timed(began, len(batch), [list(o.outputs[0].token_ids) for o in outputs], batch))
    result["generate"] = _median_run(runs)
    _profile_done(profiler, result["generate"])
    if pairs:
        tokenizer = llm.get_tokenizer()
        bos = tokenizer.bos_token_id
        prefix = (bos,) if tokenizer.encode("a", add_special_tokens=True)[:1] == [bos] else ()
        scoring = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)

        def score(batch: list[tuple[str, str]]) -> tuple[list[float], float]:
            # The same token arithmetic as the adapter, so both score exactly the same ids. Encoding text by
            # text, as lm-eval's vllm model does; its time is returned beside the sums, so the report can
            # tell it from the engine's.
            def encode(text: str) -> list[int]:
                return list(tokenizer.encode(text, add_special_tokens=False))

            encoding = time.perf_counter()
            plans = [
                plan_loglikelihood(
                    c,
                    x,
                    encode=encode,
                    prefix=prefix,
                    empty_context_token=bos,
                    max_prompt_tokens=args.max_model_len - 1,
                )
                for c, x in batch
            ]
            encoded = time.perf_counter() - encoding
            kept = [p for p in plans if p is not None]
            outs = llm.generate(
                [TokensPrompt(prompt_token_ids=list(p.token_ids)) for p in kept], scoring, use_tqdm=False
            )
            sums = []
            for plan, out in zip(kept, outs, strict=True):
                rows: Any = out.prompt_logprobs
                tail = zip(plan.token_ids[-plan.scored :], rows[-plan.scored :], strict=True)
                sums.append(sum(row[token].logprob for token, row in tail))
            return sums, encoded

        score(pairs[:64])
        profiler = _start_profiler("offline-loglikelihood")
        began = _clock()
        logprobs, encode_s = score(pairs)
        result["loglikelihood"] = {
            **_since(began),
            "encode_s": round(encode_s, 3),
            "requests": len(pairs),
            "logprobs": logprobs,
        }
        _profile_done(profiler, result["loglikelihood"])
    return result


def _start_profiler(tag: str) -> tuple[subprocess.Popen[bytes], Path] | None:
    """py-spy on this process and its children (engine cores) for ``BENCH_PYSPY_SECONDS`` seconds from now.

    Started after a phase's warm-up, so it samples the timed work; returns the running py-spy and the file it
    writes in ``$OUT`` (``pyspy-<tag>-<pid>.txt``). Off unless the variable is set and py-spy is on PATH (it
    travels with the GPU bundle).
    """
    seconds = os.environ.get("BENCH_PYSPY_SECONDS")
    spy = shutil.which("py-spy")
    if not seconds or spy is None:
        return None
    target = Path(os.environ.get("OUT", "/tmp")) / f"pyspy-{tag}-{os.getpid()}.txt"
    command = [spy, "record", "-p", str(os.getpid()), "-d", seconds, "-r", "200", "--format", "raw"]
    return subprocess.Popen(
        [*command, "--threads", "--subprocesses", "--nonblocking", "-o", str(target)]
    ), target


def _profile_done(profiler: tuple[subprocess.Popen[bytes], Path] | None, phase: dict[str, Any]) -> None:
    """Wait for the phase's py-spy (if one ran) and name its file in the phase's result."""
    if profiler is not None:
        profiler[0].wait(timeout=60)
        phase["profile"] = str(profiler[1])


def _adapter(
    args: argparse.Namespace, prompts: list[list[int]], pairs: list[tuple[str, str]]
) -> dict[str, Any]:
    import asyncbackends as ab

    options = engine_options(args)
    if args.data_parallel_size > 1:
        options["data_parallel_size"] = args.data_parallel_size
    # Mode "engines-N" (engines_per_gpu.py): the adapter with engines=N (an int, or "auto").
    engines = args.mode.removeprefix("engines-") if args.mode.startswith("engines-") else "1"
    if engines != "1":
        options["engines"] = engines if engines == "auto" else int(engines)
    start = time.perf_counter()
    backend = ab.create_backend("vllm", model=args.model_dir, **options)
    result: dict[str, Any] = {
        "init_s": time.perf_counter() - start,
        "max_concurrency": backend.capabilities.max_concurrency,
        "engines": len(getattr(backend, "engines", [backend])),
    }
    log(f"adapter engine ready in {result['init_s']:.1f}s (concurrency hint {result['max_concurrency']})")
    greedy = ab.SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    requests = [ab.GenerationRequest(tuple(p), greedy) for p in prompts]
    ab.run_batch(backend, requests[:64])
    runs = []
    profiler = _start_profiler(f"{args.mode}-generate")
    for batch in [prompts, *extra_rounds(args)]:
        requests = [ab.GenerationRequest(tuple(p), greedy) for p in batch]
        began = _clock()
        outputs = ab.run_batch(backend, requests)
        runs.append(_timed(began, len(batch), [list(o.completions[0].token_ids) for o in outputs], batch))
    result["generate"] = _median_run(runs)
    _profile_done(profiler, result["generate"])
    if pairs:
        scoring = [ab.LoglikelihoodRequest(c, x) for c, x in pairs]
        ab.run_batch(backend, scoring[:64])
        profiler = _start_profiler(f"{args.mode}-loglikelihood")
        began = _clock()
        scored = ab.run_batch(backend, scoring)
        result["loglikelihood"] = {
            **_since(began),
            "requests": len(pairs),
            "logprobs": [s.logprob for s in scored],
            "tokens": sum(s.num_tokens for s in scored),
        }
        _profile_done(profiler, result["loglikelihood"])
    if hasattr(backend, "replica_stats"):  # several engines: how the work was shared
        result["engine_requests"] = {r.label: r.requests for r in backend.replica_stats()}
    backend.close()  # type: ignore[attr-defined]  # VLLMBackend is a BaseBackend
    return result


def _plain(args: argparse.Namespace, prompts: list[list[int]]) -> dict[str, Any]:
    import asyncio

    from vllm import SamplingParams, TokensPrompt
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    params = SamplingParams(
        temperature=0.0, max_tokens=args.max_tokens, output_kind=RequestOutputKind.FINAL_ONLY
    )

    async def main() -> dict[str, Any]:
        start = time.perf_counter()
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=args.model_dir, **engine_options(args)))
        result: dict[str, Any] = {"init_s": time.perf_counter() - start}
        log(f"plain AsyncLLM ready in {result['init_s']:.1f}s")

        async def one(tag: str, prompt: list[int]) -> list[int]:
            final = None
            async for output in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, tag):
                final = output
            assert final is not None
            return list(final.outputs[0].token_ids)

        try:
            await asyncio.gather(*(one(f"w{i}", p) for i, p in enumerate(prompts[:64])))
            began = _clock()
            tokens = await asyncio.gather(*(one(f"r{i}", p) for i, p in enumerate(prompts)))
            result["generate"] = _timed(began, len(prompts), list(tokens), prompts)
        finally:
            engine.shutdown()
        return result

    return asyncio.run(main())


def extra_rounds(args: argparse.Namespace) -> list[list[list[int]]]:
    """Fresh prompts for each repeat: the same ones again would be served from vLLM's prefix cache."""
    vocab = json.loads((Path(args.model_dir) / "config.json").read_text())["vocab_size"]
    rounds = [generation_prompts(args.prompts, vocab, seed=100 + r) for r in range(1, args.repeats)]
    return [r[args.shard :: args.num_shards] for r in rounds]


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's outputs (the compared prompts) with the median run's rates; every run's time kept."""
    middle = sorted(runs, key=lambda r: r["requests"] / r["elapsed_s"])[len(runs) // 2]
    keep = ("elapsed_s", "cpu_s", "wall", "requests", "prompt_tokens", "output_tokens")
    rounds = [{k: r[k] for k in keep} for r in runs]
    return {**runs[0], **{k: middle[k] for k in keep}, "rounds": rounds}


def _clock() -> tuple[float, float, float]:
    return time.perf_counter(), time.process_time(), time.time()


def _since(start: tuple[float, float, float]) -> dict[str, Any]:
    # "wall": the phase's window on the wall clock, for the parent's GPU and host samples (gpu_monitor.py).
    return {
        "elapsed_s": time.perf_counter() - start[0],
        "cpu_s": time.process_time() - start[1],
        "wall": [start[2], time.time()],
    }


def _timed(
    began: tuple[float, float, float], count: int, tokens: list[list[int]], prompts: list[list[int]]
) -> dict[str, Any]:
    return {
        **_since(began),
        "requests": count,
        "prompt_tokens": sum(len(p) for p in prompts),
        "output_tokens": sum(len(t) for t in tokens),
        "tokens": tokens,
    }


def child(args: argparse.Namespace) -> dict[str, Any]:
    import vllm

    vocab = json.loads((Path(args.model_dir) / "config.json").read_text())["vocab_size"]
    prompts = generation_prompts(args.prompts, vocab)
    if args.num_shards > 1:
        prompts = prompts[args.shard :: args.num_shards]
    pairs = scoring_pairs(args.pairs) if args.pairs else []
    options = engine_options(args)
    log(f"{args.mode}: vllm {vllm.__version__}, {len(prompts)} prompts, {len(pairs)} pairs, {options}")
    if args.mode == "offline":
        result = _offline(args, prompts, pairs)
    elif args.mode == "adapter" or args.mode.startswith("engines-"):
        result = _adapter(args, prompts, pairs)
    else:
        result = _plain(args, prompts)
    result["vllm"] = vllm.__version__
    log(f"{args.mode}: done")
    return result
