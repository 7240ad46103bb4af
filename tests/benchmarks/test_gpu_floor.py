"""The GPU-time floor of the engines_per_gpu workload: what it counts (its timings need a GPU)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest

from .scripts import benchmark_module


@pytest.fixture(scope="module")
def floor() -> Iterator[ModuleType]:
    with benchmark_module("gpu_floor", "gpu_workload") as module:
        yield module


def test_the_workload_counts_every_token_each_phase_handles(floor: ModuleType) -> None:
    lengths, max_tokens = [2, 3, 7], 4
    counts = floor.workload_counts(lengths, max_tokens)
    # Decode step j (1 .. max_tokens - 1) of a request reads its prompt and the j tokens generated so far.
    read = sum(n + j for n in lengths for j in range(1, max_tokens))
    assert counts == {
        "requests": 3,
        "prefill_tokens": 12,
        "decode_tokens": 9,
        "head_tokens": 12,
        "context_tokens_read": read,
    }


def test_the_model_shapes_are_llamas(floor: ModuleType) -> None:
    workload = importlib.import_module("gpu_workload")
    one_b = {**workload.SHAPES["1b"], "vocab_size": 32000}
    assert floor.layer_shapes(one_b) == {
        "qkv": (2048, 3072),
        "o": (2048, 2048),
        "gate_up": (2048, 16384),
        "down": (8192, 2048),
        "lm_head": (2048, 32000),
    }
    assert floor.kv_bytes_per_token(one_b) == 16 * 2 * 8 * 64 * 2
    assert floor.kv_bytes_per_token({**workload.SHAPES["8b"], "vocab_size": 32000}) == 32 * 2 * 8 * 128 * 2


def test_the_floor_adds_products_at_their_batch_rates_and_the_kv_reads(floor: ModuleType) -> None:
    counts = {"prefill_tokens": 1000, "decode_tokens": 300, "head_tokens": 400, "context_tokens_read": 5000}
    chunk = {"qkv": 1.0, "o": 2.0, "gate_up": 3.0, "down": 4.0, "lm_head": 100.0}
    per_token = {floor.PREFILL_CHUNK: chunk, 8: {k: 10 * v for k, v in chunk.items()}}
    parts = floor.floor_seconds(
        counts, per_token, layers=2, kv_bytes=10, read_bandwidth=1000.0, decode_batch=8
    )
    assert parts == pytest.approx(
        {
            "prefill_products_s": 1000 * 2 * 10.0,  # every layer's four products, at the chunk's rate
            "decode_products_s": 300 * 2 * 100.0,  # at the decode batch's rate
            "lm_head_s": 400 * 1000.0,  # once a generated token, at the decode batch's rate
            "kv_read_s": 5000 * 10 / 1000.0,
            "floor_s": 20000 + 60000 + 400000 + 50.0,
        }
    )
