"""The ledger against a hand-computed bill: an OpenAI-compatible server reporting cached prompt tokens.

The server answers every request with a usage record in the shape OpenAI's API reference gives
(``usage.prompt_tokens_details.cached_tokens``, ``usage.completion_tokens_details.reasoning_tokens``), drawn
from a fixed table. The bill is computed from that table with `decimal` arithmetic at the stated prices: it
reads nothing the library computed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import asyncbackends as ab
from asyncbackends.testing._serve import serve

N = 10_000
PRICES = {"input": "1.75", "cached_input": "0.175", "output": "14.00", "reasoning": "14.00"}


def usage_table(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """A usage record per request: cached prompt tokens in 128-token blocks, as OpenAI caches them."""
    rng = random.Random(seed)
    table = []
    for _ in range(n):
        prompt = rng.randint(40, 4000)
        cached = 0 if prompt < 1024 or rng.random() < 0.3 else (rng.randint(1024, prompt) // 128) * 128
        completion = rng.randint(1, 600)
        reasoning = rng.randint(0, completion)
        table.append({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        })  # fmt: skip
    return table


def hand_bill(table: list[dict[str, Any]]) -> Decimal:
    p = {k: Decimal(v) for k, v in PRICES.items()}
    total = Decimal(0)
    for u in table:
        cached = u["prompt_tokens_details"]["cached_tokens"]
        reasoning = u["completion_tokens_details"]["reasoning_tokens"]
        total += (u["prompt_tokens"] - cached) * p["input"] + cached * p["cached_input"]
        total += (u["completion_tokens"] - reasoning) * p["output"] + reasoning * p["reasoning"]
    return total / Decimal(1_000_000)


class Recorded:
    """Answers ``/v1/chat/completions`` from the usage table, by the request's position in its prompt."""

    def __init__(self, table: list[dict[str, Any]]) -> None:
        self.table = table
        self.answered = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner, port = await serve(app)
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "priced", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        index = int(body["messages"][-1]["content"].split()[-1])
        self.answered += 1
        return web.json_response({
            "id": f"chatcmpl-{index}", "object": "chat.completion", "created": 0, "model": "priced",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"answer {index}"}}],
            "usage": self.table[index],
        })  # fmt: skip


@pytest.fixture(scope="module")
def recorded() -> Iterator[Recorded]:
    server = Recorded(usage_table(N))
    ab.get_loop_manager().run(server.start())
    yield server
    ab.get_loop_manager().run(server.stop())


def chats(indices: range) -> list[ab.GenerationRequest]:
    return [
        ab.GenerationRequest(
            [{"role": "user", "content": f"question {i}"}], ab.SamplingParams(max_tokens=600)
        )
        for i in indices
    ]


def pricing() -> ab.Pricing:
    return ab.Pricing(**{k: float(v) for k, v in PRICES.items()})


def cents(value: Decimal | float) -> Decimal:
    return Decimal(repr(value) if isinstance(value, float) else value).quantize(
        Decimal("0.01"), ROUND_HALF_UP
    )


# Whole answers: the recorded server does not stream (the idle limit needs a stream or a health check).
WHOLE = ab.Timeouts(total=60, idle=None)


def test_ten_thousand_requests_cost_what_the_hand_computed_bill_says(recorded: Recorded) -> None:
    backend = ab.create_backend("openai", base_url=recorded.url, model="priced", pricing=pricing())
    metrics = ab.RunMetrics()
    results = ab.run_batch(backend, chats(range(N)), concurrency=64, timeout=WHOLE, metrics=metrics)
    table = recorded.table
    assert [r.usage.cached_prompt_tokens for r in results] == [
        u["prompt_tokens_details"]["cached_tokens"] for u in table
    ]
    assert metrics.prompt_tokens == sum(u["prompt_tokens"] for u in table)
    assert metrics.cached_prompt_tokens == sum(u["prompt_tokens_details"]["cached_tokens"] for u in table)
    assert metrics.completion_tokens == sum(u["completion_tokens"] for u in table)
    assert metrics.reasoning_tokens == sum(u["completion_tokens_details"]["reasoning_tokens"] for u in table)
    assert metrics.cost is not None
    assert cents(metrics.cost) == cents(hand_bill(table))
    assert abs(Decimal(repr(metrics.cost)) - hand_bill(table)) < Decimal("1e-9")
    summary = metrics.summary()
    assert summary["cost"] == metrics.cost and summary["cached_prompt_tokens"] == metrics.cached_prompt_tokens
    assert "cached (" in metrics.format()
    backend.close()


def test_a_resumed_run_reports_the_whole_runs_ledger(recorded: Recorded, tmp_path: Path) -> None:
    backend = ab.create_backend("openai", base_url=recorded.url, model="priced", pricing=pricing())
    cache = tmp_path / "ledger.sqlite"
    ab.run_batch(backend, chats(range(300)), timeout=WHOLE, cache=cache)  # the first part of the run
    before = recorded.answered
    metrics = ab.RunMetrics()
    ab.run_batch(backend, chats(range(500)), timeout=WHOLE, cache=cache, metrics=metrics)
    assert recorded.answered - before == 200  # only the part not answered before was sent
    assert metrics.cache_hits == 300
    table = recorded.table[:500]
    assert metrics.cached_prompt_tokens == sum(u["prompt_tokens_details"]["cached_tokens"] for u in table)
    assert metrics.cost is not None and cents(metrics.cost) == cents(hand_bill(table))
    backend.close()


def test_a_cost_budget_on_the_openai_adapter_stops_before_the_limit(recorded: Recorded) -> None:
    backend = ab.create_backend("openai", base_url=recorded.url, model="priced", pricing=pricing())
    limit = Decimal("0.50")
    metrics = ab.RunMetrics()
    before = recorded.answered
    results = ab.run_batch(
        backend, chats(range(400)), timeout=WHOLE, budget=ab.Budget(cost=float(limit)), metrics=metrics,
        return_exceptions=True, concurrency=16,
    )  # fmt: skip
    done = [i for i, r in enumerate(results) if isinstance(r, ab.GenerationResult)]
    refused = [r for r in results if isinstance(r, ab.BudgetExceededError)]
    assert done and refused and len(done) + len(refused) == 400
    assert recorded.answered - before == len(done)  # nothing refused was sent
    spent = hand_bill([recorded.table[i] for i in done])
    assert spent <= limit  # worst cases reserved: 600 tokens out at the output price
    assert cents(metrics.cost or 0.0) == cents(spent)
    backend.close()


def test_the_usage_record_parsed_is_the_wire_records(recorded: Recorded) -> None:
    backend = ab.create_backend("openai", base_url=recorded.url, model="priced")
    (result,) = ab.run_batch(backend, chats(range(5, 6)), timeout=WHOLE)
    wire = recorded.table[5]
    assert isinstance(result.usage, ab.Usage)
    assert (result.usage.prompt_tokens, result.usage.cached_prompt_tokens) == (
        wire["prompt_tokens"], wire["prompt_tokens_details"]["cached_tokens"],
    )  # fmt: skip
    assert result.usage.reasoning_tokens == wire["completion_tokens_details"]["reasoning_tokens"]
    backend.close()
