"""Cached prompt tokens through a real `vllm serve --enable-prompt-tokens-details`, against its own counters.

The server's ``usage.prompt_tokens_details.cached_tokens`` per answer, read by the `openai` adapter into
`GenerationResult.cached_prompt_tokens`, summed over a 5-shot run, must equal what the server's own
Prometheus counters (``GET /metrics``: ``vllm:prefix_cache_hits``, ``vllm:prefix_cache_queries``) moved by
over the same run; the cost is the hand-computed bill of those counts.
"""

from __future__ import annotations

import re
import urllib.request
from decimal import Decimal

import pytest

import asyncbackends as ab

from ..five_shot import five_shot
from .conftest import API_KEY, Served

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


def counters(served: Served) -> dict[str, float]:
    request = urllib.request.Request(served.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    found: dict[str, float] = {"queries": 0.0, "hits": 0.0}
    for line in text.splitlines():
        match = re.match(r"^vllm:prefix_cache_(queries|hits)_total(?:\{[^}]*\})? ([0-9.e+]+)$", line)
        if match:
            found[match.group(1)] += float(match.group(2))
    return found


def test_the_servers_cached_tokens_equal_its_own_prefix_cache_counters(served: Served) -> None:
    prices = ab.Pricing(input=2.0, cached_input=0.5, output=8.0)
    backend = ab.create_backend("openai", base_url=served.base_url, api_key=API_KEY, pricing=prices)
    ab.run_batch(backend, five_shot(range(1)), timeout=ab.Timeouts(total=120, idle=None))  # shots cached
    before = counters(served)
    metrics = ab.RunMetrics()
    results = ab.run_batch(
        backend,
        five_shot(range(1, 13)),
        metrics=metrics,
        concurrency=4,
        timeout=ab.Timeouts(total=120, idle=None),
    )
    after = counters(served)
    assert all(r.cached_prompt_tokens is not None for r in results)
    assert after["hits"] - before["hits"] == metrics.cached_prompt_tokens > 0
    assert after["queries"] - before["queries"] == metrics.prompt_tokens
    assert metrics.cached_prompt_tokens / metrics.prompt_tokens >= 0.5
    bill = sum(
        (Decimal(r.prompt_tokens or 0) - (r.cached_prompt_tokens or 0)) * 2
        + Decimal(r.cached_prompt_tokens or 0) * Decimal("0.5")
        + Decimal(r.completion_tokens) * 8
        for r in results
    ) / Decimal(1_000_000)
    assert metrics.cost is not None and abs(Decimal(repr(metrics.cost)) - bill) < Decimal("1e-12")
    backend.close()
