"""GPU throughput of the vllm adapter against vLLM's offline path and a plain AsyncLLM gather.

One call of this script is one whole measurement on a GPU machine: it builds (or reuses) a synthetic
Llama-3.2-1B-shaped model directory (config.json and a locally trained tokenizer, no weights: vLLM draws
random ones with ``load_format="dummy"``), then runs each mode in its own process, one after another, and
writes JSON, a markdown table and a log under ``$OUT`` (or ``--out``).

    python benchmarks/gpu_throughput.py build --model-dir /tmp/synth-1b
    python benchmarks/gpu_throughput.py suite eager compiled --model-dir /tmp/synth-1b
    python benchmarks/gpu_throughput.py suite dp --model-dir /tmp/synth-1b     # needs two GPUs

Building the tokenizer takes ~5 minutes on 2 CPU cores: build the directory once beforehand and carry it
(2.4 MB). ``--repeats N`` times N generation rounds per process, each on fresh prompts (the same prompts
again would hit vLLM's prefix cache); ratios to offline are the median of the per-round ratios.

Suites (each mode a fresh process; only the work is timed, not engine start-up, after a small warm-up):
    eager      offline, adapter, plain, all with enforce_eager=True; loglikelihood in offline and adapter
    compiled   offline and adapter with torch.compile + CUDA graphs (enforce_eager=False), loglikelihood too
    fp32       offline and adapter in float32 on the comparison prompts only: greedy equality without
               bf16's batch-dependent rounding
    dp         --gpus N (2 by default) offline processes (CUDA_VISIBLE_DEVICES=0 ... N-1) splitting the
               prompts, started together, timed by the slowest; then the adapter with data_parallel_size=N

Modes:
    offline  ``LLM(...).generate(token prompts, SamplingParams(temperature=0, max_tokens=128))``; scoring is
             ``LLM.generate`` with ``prompt_logprobs=0, max_tokens=1`` on the token ids the adapter would send
    adapter  ``ab.run_batch`` over ``ab.create_backend("vllm", ...)``, given only what a user must give
             (model, dtype, load_format, max_model_len, enforce_eager): no scheduler or concurrency tuning
    plain    ``asyncio.gather`` over ``AsyncLLM.generate`` (FINAL_ONLY), the engine built with vLLM's plain
             defaults: ``AsyncLLM.from_engine_args(AsyncEngineArgs(...))``

No mode uses ``ignore_eos`` (the adapter's SamplingParams has none): every mode is greedy on the same
prompts, so the work is the same, and each reports its output token count to show it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

for _name, _value in {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not installed on the GPU image
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
}.items():
    os.environ.setdefault(_name, _value)

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"


def log(*parts: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


# -- the synthetic model -------------------------------------------------------------------------------


def _words(rng: random.Random, count: int) -> list[str]:
    """Pronounceable made-up words; a few are very frequent, most rare, like a natural vocabulary."""
    onsets = [
        "",
        "b",
        "d",
        "f",
        "g",
        "k",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "z",
        "st",
        "tr",
        "pl",
        "sh",
    ]
    nuclei = ["a", "e", "i", "o", "u", "ea", "oo", "ai", "ie"]
    codas = ["", "", "n", "r", "s", "t", "ng", "ck", "ld"]
    return [
        "".join(rng.choice(onsets) + rng.choice(nuclei) + rng.choice(codas) for _ in range(rng.randint(1, 4)))
        for _ in range(count)
    ]


def _sentences(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    vocabulary = _words(rng, 50_000)
    weights = [1.0 / (rank + 10) for rank in range(len(vocabulary))]
    out = []
    for _ in range(count):
        words = rng.choices(vocabulary, weights, k=rng.randint(6, 30))
        tail = rng.choice([".", ".", ",", "?", "!", f" {rng.randint(0, 9999)}."])
        out.append(" ".join(words).capitalize() + tail)
    return out


def build_model(directory: Path, vocab_size: int = 32_000, layers: int = 16) -> None:
    """Write a Llama-3.2-1B-shaped config.json and a trained byte-level BPE tokenizer (no weights).

    The files are written as plain JSON, not through transformers, so any transformers version reads them.
    """
    if (directory / "config.json").is_file() and (directory / "tokenizer.json").is_file():
        log(f"model directory {directory} exists")
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    start = time.perf_counter()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_sentences(0, 120_000), trainer=trainer)
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072, **special}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    config = {  # meta-llama/Llama-3.2-1B's shape; the vocabulary is the trained tokenizer's
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": layers,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    took = time.perf_counter() - start
    log(f"model directory {directory} built in {took:.1f}s (vocab {config['vocab_size']})")


# -- the workload (every process derives the same one from the seed) -----------------------------------


def generation_prompts(count: int, vocab: int, seed: int = 1) -> list[list[int]]:
    """Eval-shaped prompts: 32 to 512 token ids each, away from the special and byte tokens."""
    rng = random.Random(seed)
    return [[rng.randrange(300, vocab) for _ in range(rng.randint(32, 512))] for _ in range(count)]


def scoring_pairs(count: int, seed: int = 2) -> list[tuple[str, str]]:
    """(context, continuation) texts: a context of a few to ~20 sentences, a continuation of 1-8 words."""
    sentences = _sentences(seed, 4000)
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        context = " ".join(rng.choices(sentences, k=rng.randint(2, 20)))
        continuation = " " + " ".join(rng.choice(sentences).split()[: rng.randint(1, 8)])
        pairs.append((context, continuation))
    return pairs


# -- one mode, in its own process ------------------------------------------------------------------------


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
    for batch in [prompts, *extra_rounds(args)]:
        start = time.perf_counter()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], greedy, use_tqdm=False)
        runs.append(_timed(start, len(batch), [list(o.outputs[0].token_ids) for o in outputs], batch))
    result["generate"] = _median_run(runs)
    if pairs:
        tokenizer = llm.get_tokenizer()
        bos = tokenizer.bos_token_id
        prefix = (bos,) if tokenizer.encode("a", add_special_tokens=True)[:1] == [bos] else ()
        scoring = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)

        def score(batch: list[tuple[str, str]]) -> list[float]:
            # The same token arithmetic as the adapter, so both score exactly the same ids.
            def encode(text: str) -> list[int]:
                return list(tokenizer.encode(text, add_special_tokens=False))

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
            kept = [p for p in plans if p is not None]
            outs = llm.generate(
                [TokensPrompt(prompt_token_ids=list(p.token_ids)) for p in kept], scoring, use_tqdm=False
            )
            sums = []
            for plan, out in zip(kept, outs, strict=True):
                rows: Any = out.prompt_logprobs
                tail = zip(plan.token_ids[-plan.scored :], rows[-plan.scored :], strict=True)
                sums.append(sum(row[token].logprob for token, row in tail))
            return sums

        score(pairs[:64])
        start = time.perf_counter()
        logprobs = score(pairs)
        result["loglikelihood"] = {
            "elapsed_s": time.perf_counter() - start,
            "requests": len(pairs),
            "logprobs": logprobs,
        }
    return result


def _adapter(
    args: argparse.Namespace, prompts: list[list[int]], pairs: list[tuple[str, str]]
) -> dict[str, Any]:
    import asyncbackends as ab

    options = engine_options(args)
    if args.data_parallel_size > 1:
        options["data_parallel_size"] = args.data_parallel_size
    start = time.perf_counter()
    backend = ab.create_backend("vllm", model=args.model_dir, **options)
    result: dict[str, Any] = {
        "init_s": time.perf_counter() - start,
        "max_concurrency": backend.capabilities.max_concurrency,
    }
    log(f"adapter engine ready in {result['init_s']:.1f}s (concurrency hint {result['max_concurrency']})")
    greedy = ab.SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    requests = [ab.GenerationRequest(tuple(p), greedy) for p in prompts]
    ab.run_batch(backend, requests[:64])
    runs = []
    for batch in [prompts, *extra_rounds(args)]:
        requests = [ab.GenerationRequest(tuple(p), greedy) for p in batch]
        start = time.perf_counter()
        outputs = ab.run_batch(backend, requests)
        runs.append(_timed(start, len(batch), [list(o.completions[0].token_ids) for o in outputs], batch))
    result["generate"] = _median_run(runs)
    if pairs:
        scoring = [ab.LoglikelihoodRequest(c, x) for c, x in pairs]
        ab.run_batch(backend, scoring[:64])
        start = time.perf_counter()
        scored = ab.run_batch(backend, scoring)
        result["loglikelihood"] = {
            "elapsed_s": time.perf_counter() - start,
            "requests": len(pairs),
            "logprobs": [s.logprob for s in scored],
            "tokens": sum(s.num_tokens for s in scored),
        }
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
            start = time.perf_counter()
            tokens = await asyncio.gather(*(one(f"r{i}", p) for i, p in enumerate(prompts)))
            result["generate"] = _timed(start, len(prompts), list(tokens), prompts)
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
    keep = ("elapsed_s", "requests", "prompt_tokens", "output_tokens")
    rounds = [{k: r[k] for k in keep} for r in runs]
    return {**runs[0], **{k: middle[k] for k in keep}, "rounds": rounds}


def _timed(start: float, count: int, tokens: list[list[int]], prompts: list[list[int]]) -> dict[str, Any]:
    elapsed = time.perf_counter() - start
    return {
        "elapsed_s": elapsed,
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
    elif args.mode == "adapter":
        result = _adapter(args, prompts, pairs)
    else:
        result = _plain(args, prompts)
    result["vllm"] = vllm.__version__
    log(f"{args.mode}: done")
    return result


# -- the parent: suites of children, comparisons, the report --------------------------------------------

SUITES: dict[str, list[list[tuple[str, dict[str, Any]]]]] = {
    # Each step's children run together (the dp shards); steps run one after another.
    "eager": [[("offline", {})], [("adapter", {})], [("plain", {"pairs": 0})]],
    "compiled": [[("offline", {"compiled": True})], [("adapter", {"compiled": True})]],
    "fp32": [
        [("offline", {"dtype": "float32", "prompts": "compare", "pairs": 0})],
        [("adapter", {"dtype": "float32", "prompts": "compare", "pairs": 0})],
    ],
}


def _dp_suite(gpus: int) -> list[list[tuple[str, dict[str, Any]]]]:
    """``gpus`` offline processes, one per GPU, splitting the prompts; then the adapter with DP=``gpus``."""
    shards = [
        ("offline", {"pairs": 0, "shard": i, "num_shards": gpus, "env": {"CUDA_VISIBLE_DEVICES": str(i)}})
        for i in range(gpus)
    ]
    return [shards, [("adapter", {"pairs": 0, "data_parallel_size": gpus})]]


def _suite(name: str, args: argparse.Namespace) -> list[list[tuple[str, dict[str, Any]]]]:
    return _dp_suite(args.gpus) if name == "dp" else SUITES[name]


def _child_command(args: argparse.Namespace, mode: str, spec: dict[str, Any], result: Path) -> list[str]:
    prompts = args.compare if spec.get("prompts") == "compare" else args.prompts
    command = [sys.executable, os.path.abspath(__file__), "child", mode, "--model-dir", args.model_dir]
    command += [
        "--prompts",
        str(prompts),
        "--pairs",
        str(spec.get("pairs", args.pairs)),
        "--result",
        str(result),
    ]
    command += ["--max-tokens", str(args.max_tokens), "--max-model-len", str(args.max_model_len)]
    command += ["--dtype", spec.get("dtype", args.dtype)]
    command += ["--shard", str(spec.get("shard", 0)), "--num-shards", str(spec.get("num_shards", 1))]
    command += [
        "--data-parallel-size",
        str(spec.get("data_parallel_size", 1)),
        "--engine-extra",
        args.engine_extra,
        "--repeats",
        str(args.repeats),
    ]
    return command + (["--compiled"] if spec.get("compiled") else [])


def _run_step(
    args: argparse.Namespace,
    suite: str,
    step: list[tuple[str, dict[str, Any]]],
    deadline: float,
    logfile: Any,
) -> list[dict[str, Any] | None]:
    """Start the step's children together, stream their output, and collect their results."""
    children = []
    for index, (mode, spec) in enumerate(step):
        result = Path(args.work_dir) / f"{suite}-{mode}-{index}.json"
        result.unlink(missing_ok=True)
        env = {**os.environ, **spec.get("env", {})}
        command = _child_command(args, mode, spec, result)
        log(f"{suite}: start {mode} {spec}")
        process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        children.append((f"{suite}/{mode}{index if len(step) > 1 else ''}", process, result))
    import threading

    def pump(tag: str, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            text = f"{tag}| {line.rstrip()}"
            print(text, flush=True)
            logfile.write(text + "\n")

    pumps = [threading.Thread(target=pump, args=(tag, p), daemon=True) for tag, p, _ in children]
    for thread in pumps:
        thread.start()
    outcomes: list[dict[str, Any] | None] = []
    for tag, process, result in children:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log(f"{tag}: out of time, stopping it")
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)  # engine processes the child left behind
        outcome = json.loads(result.read_text()) if result.is_file() else None
        log(f"{tag}: exit {process.returncode}, {'result' if outcome else 'NO RESULT'}")
        outcomes.append(outcome)
    for thread in pumps:
        thread.join(timeout=5)
    return outcomes


def _rate(part: dict[str, Any]) -> dict[str, float]:
    elapsed = part["elapsed_s"]
    rates = {"req_per_s": part["requests"] / elapsed, "elapsed_s": elapsed, "requests": part["requests"]}
    if "output_tokens" in part:
        rates |= {
            "output_tokens": part["output_tokens"],
            "prompt_tokens": part["prompt_tokens"],
            "out_tok_per_s": part["output_tokens"] / elapsed,
            "total_tok_per_s": (part["output_tokens"] + part["prompt_tokens"]) / elapsed,
        }
    return rates


def _same_greedy(reference: list[list[int]], other: list[list[int]], count: int) -> dict[str, Any]:
    pairs = list(zip(reference[:count], other[:count], strict=False))
    diverge = [
        next((i for i, (a, b) in enumerate(zip(r, o, strict=False)) if a != b), min(len(r), len(o)))
        for r, o in pairs
        if r != o
    ]
    return {
        "compared": len(pairs),
        "identical": sum(r == o for r, o in pairs),
        "identical_tokens": sum(sum(a == b for a, b in zip(r, o, strict=False)) for r, o in pairs),
        "tokens": sum(len(r) for r, _ in pairs),
        "median_first_divergence": sorted(diverge)[len(diverge) // 2] if diverge else None,
    }


def summarize(suite: str, outcomes: dict[str, list[dict[str, Any] | None]], compare: int) -> dict[str, Any]:
    """Rates per mode, ratios to offline, greedy equality and scoring agreement with offline."""
    summary: dict[str, Any] = {}
    shards = [o for o in outcomes.get("offline", []) if o]
    if len(outcomes.get("offline", [])) > 1:  # dp: the shards ran together; the slower one is the time
        if len(shards) == len(outcomes["offline"]):
            merged = {
                "elapsed_s": max(s["generate"]["elapsed_s"] for s in shards),
                "requests": sum(s["generate"]["requests"] for s in shards),
                "prompt_tokens": sum(s["generate"]["prompt_tokens"] for s in shards),
                "output_tokens": sum(s["generate"]["output_tokens"] for s in shards),
            }
            summary["offline"] = {"generate": _rate(merged), "init_s": [s["init_s"] for s in shards]}
            summary["offline"]["shard_elapsed_s"] = [s["generate"]["elapsed_s"] for s in shards]
            rounds = zip(*(s["generate"]["rounds"] for s in shards), strict=True)
            summary["offline"]["generate"]["rounds_req_per_s"] = [
                sum(r["requests"] for r in pair) / max(r["elapsed_s"] for r in pair) for pair in rounds
            ]
        offline = None
    else:
        offline = shards[0] if shards else None
    for mode, runs in outcomes.items():
        if mode == "offline" and summary.get("offline"):
            continue
        run = runs[0] if runs else None
        if run is None:
            summary[mode] = None
            continue
        entry: dict[str, Any] = {"init_s": run["init_s"], "vllm": run.get("vllm")}
        entry["generate"] = _rate(run["generate"])
        entry["generate"]["rounds_req_per_s"] = [
            r["requests"] / r["elapsed_s"] for r in run["generate"]["rounds"]
        ]
        if "loglikelihood" in run:
            entry["loglikelihood"] = _rate(run["loglikelihood"])
        if offline is not None and mode != "offline":
            entry["greedy_vs_offline"] = _same_greedy(
                offline["generate"]["tokens"], run["generate"]["tokens"], compare
            )
            if "loglikelihood" in run and "loglikelihood" in offline:
                ours, theirs = run["loglikelihood"]["logprobs"], offline["loglikelihood"]["logprobs"]
                diffs = sorted(abs(a - b) for a, b in zip(ours, theirs, strict=False))
                entry["loglikelihood_vs_offline"] = {
                    "compared": len(diffs),
                    "max_abs_diff": diffs[-1] if diffs else None,
                    "median_abs_diff": diffs[len(diffs) // 2] if diffs else None,
                }
        summary[mode] = entry
    base = summary.get("offline")
    for mode, entry in summary.items():
        if entry and base and mode != "offline":
            for part in ("generate", "loglikelihood"):
                if part in entry and part in base:
                    entry[part]["ratio_to_offline"] = entry[part]["req_per_s"] / base[part]["req_per_s"]
            ours, theirs = (
                e.get("generate", {}).get("rounds_req_per_s", []) for e in (entry or {}, base or {})
            )
            if entry and base and mode != "offline" and len(ours) == len(theirs) > 1:
                # Round i of every mode ran the same prompts: compare like with like, then take the median.
                ratios = sorted(a / b for a, b in zip(ours, theirs, strict=True))
                entry["generate"]["ratio_to_offline"] = ratios[len(ratios) // 2]
                entry["generate"]["round_ratios"] = ratios
    return summary


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| suite | mode | work | req/s | out tok/s | total tok/s | x offline | output tokens | start s |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    notes = []
    for suite, summary in results["suites"].items():
        for mode, entry in summary.items():
            if not entry:
                lines.append(f"| {suite} | {mode} | - | failed or skipped | | | | | |")
                continue
            for part in ("generate", "loglikelihood"):
                if part not in entry:
                    continue
                r = entry[part]
                ratio = (
                    f"{r['ratio_to_offline']:.2f}"
                    if "ratio_to_offline" in r
                    else "1.00"
                    if mode == "offline"
                    else ""
                )
                init = entry["init_s"]
                init_text = "/".join(f"{x:.0f}" for x in init) if isinstance(init, list) else f"{init:.0f}"
                lines.append(
                    f"| {suite} | {mode} | {part} | {r['req_per_s']:.1f} | {r.get('out_tok_per_s', 0):.0f} | "
                    f"{r.get('total_tok_per_s', 0):.0f} | {ratio} | {r.get('output_tokens', '')} | "
                    f"{init_text} |"
                )
            spread = entry.get("generate", {}).get("rounds_req_per_s", [])
            if len(spread) > 1:
                notes.append(
                    f"- {suite}/{mode}: generate rounds (req/s): {', '.join(f'{x:.1f}' for x in spread)}"
                )
            if "greedy_vs_offline" in entry:
                g = entry["greedy_vs_offline"]
                notes.append(
                    f"- {suite}/{mode}: greedy outputs identical to offline for "
                    f"{g['identical']}/{g['compared']} prompts ({g['identical_tokens']}/{g['tokens']} tokens "
                    "at equal positions; median first "
                    f"divergence at token {g['median_first_divergence']})"
                )
            if "loglikelihood_vs_offline" in entry:
                s = entry["loglikelihood_vs_offline"]
                notes.append(
                    f"- {suite}/{mode}: loglikelihoods vs offline over {s['compared']} pairs: max |diff| "
                    f"{s['max_abs_diff']:.2e}, median {s['median_abs_diff']:.2e}"
                )
    return "\n".join([*lines, "", *notes]) + "\n"


def run_suites(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.deadline
    out = Path(args.out or os.environ.get("OUT") or "/tmp/gpu_throughput")
    out.mkdir(parents=True, exist_ok=True)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    build_model(Path(args.model_dir))
    name = "-".join(args.suites)
    results: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "func"}, "suites": {}}
    try:
        import torch

        results["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        results["torch"] = torch.__version__
    except Exception as exc:  # the report still says what ran
        results["gpu"] = repr(exc)
    with open(out / f"gpu_{name}.log", "w") as logfile:
        for suite in args.suites:
            outcomes: dict[str, list[dict[str, Any] | None]] = {}
            for step in _suite(suite, args):
                left = deadline - time.monotonic()
                if left < args.min_step:
                    log(f"{suite}: {left:.0f}s left, skipping {[mode for mode, _ in step]}")
                    for mode, _ in step:
                        outcomes.setdefault(mode, []).append(None)
                    continue
                for (mode, _), outcome in zip(
                    step, _run_step(args, suite, step, deadline, logfile), strict=False
                ):
                    outcomes.setdefault(mode, []).append(outcome)
            results["suites"][suite] = summarize(suite, outcomes, args.compare)
            (out / f"gpu_{name}.json").write_text(json.dumps(results, indent=1))
            (out / f"gpu_{name}.md").write_text(markdown(results))
    print(markdown(results), flush=True)
    return 0 if all(all(results["suites"][s].values()) for s in args.suites) else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["build", "suite", "child"])
    parser.add_argument("names", nargs="*", help="suite: the suites to run; child: the mode")
    parser.add_argument("--model-dir", default="/tmp/synth-llama-1b")
    parser.add_argument("--layers", type=int, default=16, help="build: hidden layers (Llama-3.2-1B has 16)")
    parser.add_argument("--prompts", type=int, default=4000)
    parser.add_argument("--pairs", type=int, default=5000, help="loglikelihood pairs (0: none)")
    parser.add_argument("--compare", type=int, default=400, help="prompts whose greedy outputs are compared")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--deadline", type=float, default=560.0, help="suite: seconds for the whole call")
    parser.add_argument("--min-step", type=float, default=75.0, help="suite: skip a step with less time left")
    parser.add_argument("--out", default=None, help="suite: where results go ($OUT by default)")
    parser.add_argument("--work-dir", default="/tmp/gpu_throughput_work")
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--repeats", type=int, default=1, help="timed generation rounds per process (median)")
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--num-shards", type=int, default=1)
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=2, help="suite dp: GPUs (offline processes and DP size)")
    parser.add_argument("--result", default=None, help="child: where to write its result")
    parser.add_argument(
        "--engine-extra", default="{}", help="JSON engine options for every mode (CPU smoke test)"
    )
    args = parser.parse_args()
    if args.command == "build":
        build_model(Path(args.model_dir), layers=args.layers)
        return 0
    if args.command == "suite":
        unknown = [s for s in args.names if s not in [*SUITES, "dp"]]
        if unknown or not args.names:
            parser.error(f"suites: choose from {sorted([*SUITES, 'dp'])}")
        args.suites = args.names
        return run_suites(args)
    args.mode = args.names[0]
    result = child(args)
    Path(args.result).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
