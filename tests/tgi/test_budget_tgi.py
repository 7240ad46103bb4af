"""A budget on the `tgi` adapter: the look-alike's own counts say what was sent and what it cost."""

from __future__ import annotations

import pytest

import asyncbackends as ab

from .conftest import MakeBackend, MakeServer


@pytest.mark.asyncio
async def test_a_token_budget_stops_a_tgi_run_before_it_is_passed(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server()
    backend = await make_backend(server.url)
    prompts = [f"the question number {i:03d} asks" for i in range(60)]
    requests = [ab.GenerationRequest(p, ab.SamplingParams(max_tokens=8), request_id=p) for p in prompts]
    unbounded = await ab.gather(backend, requests[:1])
    each = unbounded[0].usage.total_tokens  # the server's own counts: x-prompt-tokens and tokens generated
    received = len(server.received)
    budget = each * 20 + each // 2
    results = await ab.gather(
        backend, requests, budget=ab.Budget(tokens=budget), concurrency=8, return_exceptions=True
    )
    done = [r for r in results if isinstance(r, ab.GenerationResult)]
    refused = [r for r in results if isinstance(r, ab.BudgetExceededError)]
    assert len(done) + len(refused) == 60 and refused
    assert len(server.received) - received == len(done)  # what was refused never reached the server
    assert sum(r.usage.total_tokens for r in done) <= budget
    assert len(done) >= 19  # the prompts are alike in size: the budget is used almost whole
