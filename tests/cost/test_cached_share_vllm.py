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

from ..five_shot import five_shot

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


def test_a_five_shot_run_reports_the_engines_own_cached_share(stats_engine: Any) -> None:
    requests = five_shot(range(40))
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


def test_a_token_budget_stops_the_in_process_engine_and_the_engine_saw_only_what_was_sent(
    stats_engine: Any,
) -> None:
    requests = [
        ab.GenerationRequest(
            f"Budget probe {i:03d}: continue the list 1 2 3", ab.SamplingParams(max_tokens=16)
        )
        for i in range(60)
    ]
    queries_before, _ = prefix_counters()
    results = ab.run_batch(
        stats_engine, requests, budget=ab.Budget(tokens=400), concurrency=8, return_exceptions=True
    )
    queries, _ = prefix_counters()
    done = [r for r in results if isinstance(r, ab.GenerationResult)]
    refused = [r for r in results if isinstance(r, ab.BudgetExceededError)]
    assert done and refused and len(done) + len(refused) == 60
    assert sum(r.usage.total_tokens for r in done) <= 400
    # The engine looked up exactly the prompts of the requests that were sent: nothing refused reached it.
    assert queries - queries_before == sum(r.usage.prompt_tokens for r in done)
