"""The in-process engine's cached prompt share, checked against the engine's own prefix-cache counters.

A 5-shot MMLU-shaped run (one few-shot context shared by every question) reads most of each prompt from
vLLM's prefix cache. Each result's `cached_prompt_tokens` is the engine's ``num_cached_tokens``; their sum
must equal what vLLM's own Prometheus counters (``vllm:prefix_cache_hits``, ``vllm:prefix_cache_queries``)
recorded over the same run, read through `vllm.v1.metrics.reader` on an engine with stats on.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

import asyncbackends as ab

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
    pytest.mark.timeout(600),
]


@pytest.fixture(scope="module")
def stats_engine() -> Iterator[Any]:
    from asyncbackends.testing.tiny_model import build_tiny_model

    from ..tiny_engine import build_backend

    backend = build_backend(str(build_tiny_model()), disable_log_stats=False)
    yield backend
    backend.close()


def prefix_counters() -> tuple[int, int]:
    from vllm.v1.metrics.reader import Counter, get_metrics_snapshot

    values = {"vllm:prefix_cache_queries": 0, "vllm:prefix_cache_hits": 0}
    for metric in get_metrics_snapshot():
        if isinstance(metric, Counter) and metric.name in values:
            values[metric.name] += metric.value
    return values["vllm:prefix_cache_queries"], values["vllm:prefix_cache_hits"]


def mmlu_shaped(questions: int) -> list[ab.GenerationRequest]:
    shots = "".join(
        f"Question: which of these is item {k} of the list {k * 7} {k * 11} {k * 13}?\n"
        f"A. one\nB. two\nC. three\nD. four\nAnswer: {'ABCD'[k % 4]}\n\n"
        for k in range(5)
    )
    return [
        ab.GenerationRequest(
            f"{shots}Question: what is {q} plus {q * 3}?\nA. {q}\nB. {q + 1}\nC. {q + 2}\nD. {q + 3}\nAnswer:",
            ab.SamplingParams(max_tokens=1),
        )
        for q in range(questions)
    ]


def test_a_five_shot_run_reports_the_engines_own_cached_share(stats_engine: Any) -> None:
    requests = mmlu_shaped(40)
    ab.run_batch(stats_engine, requests[:1])  # the shared context enters the cache once
    queries_before, hits_before = prefix_counters()
    metrics = ab.RunMetrics()
    results = ab.run_batch(stats_engine, requests[1:], metrics=metrics, concurrency=8)
    queries, hits = prefix_counters()
    assert queries - queries_before == metrics.prompt_tokens  # every prompt was looked up, once
    assert (
        hits - hits_before
        == metrics.cached_prompt_tokens
        == sum(r.usage.cached_prompt_tokens for r in results)
    )
    assert metrics.cached_prompt_tokens / metrics.prompt_tokens >= 0.8
    assert all(0 < r.usage.cached_prompt_tokens < r.usage.prompt_tokens for r in results)
