"""The least GPU time the engines_per_gpu workload can take on this GPU, however many engines share it.

Issue 29 asks for 2.5x vLLM's offline ``LLM.generate``. Engines time-sliced on one GPU cannot do the model's
arithmetic faster than the GPU does it for one process, so the workload has a floor: its matrix products at
the best rate this GPU gives them in bf16, plus reading the KV cache once per generated token at the GPU's
read bandwidth. Both are measured here, on the GPU, with the model's own shapes (``config.json``) and the
workload's own prompts (``gpu_workload.generation_prompts``): no engine, no vLLM.

What is counted (everything else an engine does, attention's arithmetic, norms, rotary embeddings,
sampling, scheduling, is left out, so the floor is below any real run):

- prefill: every prompt token through every layer's four products (qkv, o, gate_up, down) at the rate of a
  16384-token chunk (vLLM's offline ``max_num_batched_tokens`` on this GPU);
- decode: ``max_tokens - 1`` tokens a request through the layers, and ``max_tokens`` through the LM head, at
  the rate of a decode batch of ``--decode-batch`` tokens; the row "16384" puts decode at the prefill chunk's
  rate too, which no real batching reaches: the floor of any arrangement;
- the KV cache read by decode attention: each decode token reads its request's whole context once.

    python benchmarks/gpu/gpu_floor.py --model-dir DIR --prompts 4096 --max-tokens 128

Writes ``$OUT/gpu_floor.json`` and prints a table: the floor in seconds and the most requests a second it
allows, which an ``engines_per_gpu.py`` run compares with its processes' times. ``--time-slicing N`` also
measures N processes launching the decode step's largest per-layer product (gate_up) at once against one
process launching them all (what the GPU's time-slicing between processes costs without an engine around it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_workload import generation_prompts

PREFILL_CHUNK = 16384


def _attention(config: dict[str, Any]) -> tuple[int, int, int]:
    """Query heads, key/value heads and head size, with Llama's defaults for the ones left out."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return heads, kv_heads, int(config.get("head_dim") or int(config["hidden_size"]) // heads)


def layer_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of one decoder layer's four products and of the LM head."""
    hidden, intermediate = int(config["hidden_size"]), int(config["intermediate_size"])
    heads, kv_heads, head_dim = _attention(config)
    return {
        "qkv": (hidden, (heads + 2 * kv_heads) * head_dim),
        "o": (heads * head_dim, hidden),
        "gate_up": (hidden, 2 * intermediate),
        "down": (intermediate, hidden),
        "lm_head": (hidden, int(config["vocab_size"])),
    }


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int = 2) -> int:
    """Bytes of K and V one token keeps in the cache, all layers."""
    _, kv_heads, head_dim = _attention(config)
    return int(config["num_hidden_layers"]) * 2 * kv_heads * head_dim * dtype_bytes


def workload_counts(lengths: list[int], max_tokens: int) -> dict[str, int]:
    """Tokens through the layers in prefill and decode, tokens through the LM head, context tokens read."""
    decode_steps = max_tokens - 1  # the first generated token comes out of the prefill
    return {
        "requests": len(lengths),
        "prefill_tokens": sum(lengths),
        "decode_tokens": len(lengths) * decode_steps,
        "head_tokens": len(lengths) * max_tokens,
        # step j of a request reads its prompt and the j tokens generated before it
        "context_tokens_read": sum(
            n * decode_steps + decode_steps * (decode_steps + 1) // 2 for n in lengths
        ),
    }


def floor_seconds(
    counts: dict[str, int],
    per_token: dict[int, dict[str, float]],
    layers: int,
    kv_bytes: int,
    read_bandwidth: float,
    decode_batch: int,
) -> dict[str, float]:
    """The floor's parts (seconds) from measured per-token product times (seconds) at each batch size."""
    layer_keys = ("qkv", "o", "gate_up", "down")
    prefill = counts["prefill_tokens"] * layers * sum(per_token[PREFILL_CHUNK][k] for k in layer_keys)
    decode = counts["decode_tokens"] * layers * sum(per_token[decode_batch][k] for k in layer_keys)
    head = counts["head_tokens"] * per_token[decode_batch]["lm_head"]
    kv = counts["context_tokens_read"] * kv_bytes / read_bandwidth
    parts = {"prefill_products_s": prefill, "decode_products_s": decode, "lm_head_s": head, "kv_read_s": kv}
    return {**parts, "floor_s": sum(parts.values())}


def _gpu_seconds(work: Any, repeats: int) -> float:
    """The median device time of ``work()`` over ``repeats`` runs, each between two CUDA events."""
    import torch

    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def _time_products(
    shapes: dict[str, tuple[int, int]], batches: list[int], repeats: int, burst: int = 20
) -> dict[int, dict[str, float]]:
    """Seconds per token of each product at each batch size.

    Each timing is a burst of ``burst`` back-to-back launches between two events (one launch alone would
    count the events' own cost), the median of ``repeats`` bursts.
    """
    import torch

    result: dict[int, dict[str, float]] = {}
    for batch in batches:
        result[batch] = {}
        for name, (inp, out) in shapes.items():
            # Several weight copies in turn, so a weight that fits the 60 MB L2 is not read from cache.
            weights = [torch.randn(out, inp, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
            x = torch.randn(batch, inp, device="cuda", dtype=torch.bfloat16)
            for w in weights:
                torch.nn.functional.linear(x, w)  # vLLM's default_unquantized_gemm is F.linear

            def launches(x: Any = x, weights: list[Any] = weights) -> None:
                for i in range(burst):
                    torch.nn.functional.linear(x, weights[i % len(weights)])

            result[batch][name] = _gpu_seconds(launches, repeats) / burst / batch
            del weights, x
    return result


def _sliced_worker(
    ready: Any, go: Any, results: Any, shape: tuple[int, int], batch: int, launches: int
) -> None:
    import time

    import torch

    inp, out = shape
    weights = [torch.randn(out, inp, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    x = torch.randn(batch, inp, device="cuda", dtype=torch.bfloat16)
    for i in range(50):
        torch.nn.functional.linear(x, weights[i % 4])
    torch.cuda.synchronize()
    ready.put(1)
    go.wait()
    began = time.time()
    for i in range(launches):
        torch.nn.functional.linear(x, weights[i % 4])
    torch.cuda.synchronize()
    results.put((began, time.time()))


def time_slicing(processes: int, shape: tuple[int, int], batch: int, launches: int) -> dict[str, float]:
    """Products a second from ``processes`` processes sharing the GPU against one process doing all of them.

    Without MPS the GPU runs one process's kernels at a time; this measures what that costs on its own,
    with a decode step's largest per-layer product (gate_up), no engine around it.
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")

    def run(count: int, each: int) -> float:
        ready, results, go = context.Queue(), context.Queue(), context.Event()
        workers = [
            context.Process(target=_sliced_worker, args=(ready, go, results, shape, batch, each))
            for _ in range(count)
        ]
        for worker in workers:
            worker.start()
        for _ in workers:
            ready.get(timeout=300)
        go.set()
        spans = [results.get(timeout=300) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
        return count * each / (max(e for _, e in spans) - min(b for b, _ in spans))

    alone = run(1, launches * processes)
    shared = run(processes, launches)
    return {
        "processes": processes,
        "alone_per_s": alone,
        "shared_per_s": shared,
        "efficiency": shared / alone,
    }


def _read_bandwidth(gib: float = 4.0) -> float:
    """Bytes a second a reduction reads from device memory (a sum over ``gib`` GiB of bf16)."""
    import torch

    x = torch.randn(int(gib * (1 << 30)) // 2, device="cuda", dtype=torch.bfloat16)
    x.sum()
    return x.numel() * 2 / _gpu_seconds(x.sum, 10)


def _peak_matmul() -> float:
    """bf16 FLOP/s of an 8192^3 product on random data (KINDS.md's reference measure)."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    return 2 * 8192**3 / _gpu_seconds(lambda: a @ b, 10)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--decode-batch",
        type=int,
        nargs="+",
        default=[512, 683, 1024],
        help="decode batch sizes to time (4096 prompts over 6 engines: 683; offline: 1024)",
    )
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--time-slicing", type=int, default=0, help="also: N processes sharing the GPU against one (0: skip)"
    )
    parser.add_argument("--slicing-launches", type=int, default=4000, help="products each process launches")
    args = parser.parse_args()
    import torch

    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    lengths = [len(p) for p in generation_prompts(args.prompts, int(config["vocab_size"]))]
    counts = workload_counts(lengths, args.max_tokens)
    shapes = layer_shapes(config)
    per_token = _time_products(shapes, [PREFILL_CHUNK, *args.decode_batch], args.repeats)
    bandwidth = _read_bandwidth()
    layers = int(config["num_hidden_layers"])
    kv_bytes = kv_bytes_per_token(config)
    floors = {
        batch: floor_seconds(counts, per_token, layers, kv_bytes, bandwidth, batch)
        for batch in args.decode_batch
    }
    # Every product at the prefill chunk's rate: no batching of decode could do better than that.
    floors[PREFILL_CHUNK] = floor_seconds(counts, per_token, layers, kv_bytes, bandwidth, PREFILL_CHUNK)
    best = min(floors.values(), key=lambda f: f["floor_s"])
    flops = {
        name: 2 * inp * out / per_token[PREFILL_CHUNK][name] / 1e12 for name, (inp, out) in shapes.items()
    }
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "counts": counts,
        "per_token_s": {str(b): v for b, v in per_token.items()},
        "prefill_chunk_tflops": flops,
        "read_bandwidth_tb_s": bandwidth / 1e12,
        "peak_matmul_tflops": _peak_matmul() / 1e12,
        "kv_bytes_per_token": kv_bytes,
        "floors": {str(b): f for b, f in floors.items()},
        "floor_s": best["floor_s"],
        "max_req_per_s": counts["requests"] / best["floor_s"],
    }
    if args.time_slicing:
        result["time_slicing"] = time_slicing(
            args.time_slicing, shapes["gate_up"], args.decode_batch[0], args.slicing_launches
        )
    out = Path(os.environ.get("OUT", "/tmp")) / "gpu_floor.json"
    out.write_text(json.dumps(result, indent=1))
    print(
        f"GPU {result['gpu']}: 8192^3 bf16 {result['peak_matmul_tflops']:.0f} TFLOP/s, "
        f"read {result['read_bandwidth_tb_s']:.2f} TB/s"
    )
    print("prefill-chunk products TFLOP/s: " + ", ".join(f"{k} {v:.0f}" for k, v in flops.items()))
    print(
        "| decode batch | prefill products s | decode products s | LM head s | KV read s | floor s | req/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch, f in floors.items():
        cells = [
            f[k] for k in ("prefill_products_s", "decode_products_s", "lm_head_s", "kv_read_s", "floor_s")
        ]
        rate = counts["requests"] / f["floor_s"]
        print(f"| {batch} | " + " | ".join(f"{x:.2f}" for x in cells) + f" | {rate:.0f} |")
    if "time_slicing" in result:
        t = result["time_slicing"]
        print(
            f"time slicing: {t['processes']} processes {t['shared_per_s']:.0f} products/s, one process "
            f"{t['alone_per_s']:.0f}: {t['efficiency']:.2f} of it"
        )
    print(
        json.dumps({"counts": counts, "floor_s": result["floor_s"], "max_req_per_s": result["max_req_per_s"]})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
