"""`budget=ab.Budget(...)`: a run stops sending before it passes its budget, loses nothing, and resumes.

The reference for what each request costs is the mock's published model (one character one token, a greedy
answer echoes the prompt up to ``max_tokens``), written out here, not read from the library's ledger.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path

import pytest

import asyncbackends as ab

PRICES = ab.Pricing(input=2.5, cached_input=1.25, output=10.0)


def prompts(n: int) -> list[str]:
    return [f"question {i:04d}: what follows?" for i in range(n)]


def requests(texts: list[str], max_tokens: int = 16) -> list[ab.GenerationRequest]:
    return [
        ab.GenerationRequest(t, ab.SamplingParams(max_tokens=max_tokens), request_id=f"r{i}")
        for i, t in enumerate(texts)
    ]


def mock_tokens(text: str, max_tokens: int) -> tuple[int, int]:
    """The mock's usage for a greedy text prompt: its characters in, the echo cut at max_tokens out."""
    return len(text), min(len(text), max_tokens)


def bill(pairs: list[tuple[int, int]]) -> Decimal:
    """Prices per million tokens, summed exactly."""
    total = sum(Decimal(p) * Decimal("2.5") + Decimal(c) * Decimal("10") for p, c in pairs)
    return total / Decimal(1_000_000)


def sent(backend: ab.AsyncBackend) -> int:
    return sum(backend.attempts.values())  # type: ignore[attr-defined]


@pytest.mark.parametrize("concurrency", [1, 8, 64])
def test_a_token_budget_stops_the_run_before_it_is_passed_and_loses_nothing(concurrency: int) -> None:
    backend = ab.create_backend("mock", latency=0.001)
    texts = prompts(200)
    each = sum(mock_tokens(texts[0], 16))
    budget = each * 50 + each // 2  # room for 50 requests and a half
    results = ab.run_batch(
        backend, requests(texts), budget=ab.Budget(tokens=budget), concurrency=concurrency,
        return_exceptions=True,
    )  # fmt: skip
    done = [r for r in results if isinstance(r, ab.GenerationResult)]
    refused = [r for r in results if isinstance(r, ab.BudgetExceededError)]
    assert len(done) + len(refused) == 200  # one outcome per request, nothing else
    spent = sum(sum(mock_tokens(texts[int(r.request_id[1:])], 16)) for r in done)  # type: ignore[index]
    assert spent <= budget
    assert len(done) == 50  # prompts alike: the budget is used up to its last whole request
    assert sent(backend) == len(done)  # a refused request never reached the backend
    assert all(e.request_id is not None and not e.retryable and e.backend == "mock" for e in refused)
    assert "larger budget" in str(refused[0])
    backend.close()


def test_a_cost_budget_counts_the_prices_and_resumes_with_a_larger_one(tmp_path: Path) -> None:
    texts = prompts(120)
    cache = tmp_path / "run.sqlite"
    undisturbed = ab.create_backend("mock")
    expected = ab.run_batch(undisturbed, requests(texts))
    undisturbed.close()

    backend = ab.create_backend("mock", latency=0.001, pricing=PRICES)
    pairs = [mock_tokens(t, 16) for t in texts]
    limit = bill(pairs[:40])  # exactly the first 40 requests' cost
    metrics = ab.RunMetrics()
    first = ab.run_batch(
        backend, requests(texts), budget=ab.Budget(cost=float(limit)), cache=cache, metrics=metrics,
        return_exceptions=True, concurrency=16,
    )  # fmt: skip
    done = [i for i, r in enumerate(first) if isinstance(r, ab.GenerationResult)]
    assert 0 < len(done) <= 40 and sent(backend) == len(done)
    assert metrics.cost is not None and Decimal(repr(metrics.cost)) <= limit + Decimal("1e-12")
    assert abs(Decimal(repr(metrics.cost)) - bill([pairs[i] for i in done])) < Decimal("1e-12")

    # The resume sends only what the first run did not, and its ledger is the whole run's.
    resumed_metrics = ab.RunMetrics()
    second = ab.run_batch(
        backend, requests(texts), budget=ab.Budget(cost=1.0), cache=cache, metrics=resumed_metrics,
        concurrency=16,
    )  # fmt: skip
    assert sent(backend) == len(texts)  # each request sent exactly once over the two runs
    assert [r.text for r in second] == [r.text for r in expected]
    assert resumed_metrics.cache_hits == len(done)
    assert resumed_metrics.cost is not None
    assert abs(Decimal(repr(resumed_metrics.cost)) - bill(pairs)) < Decimal("1e-12")
    backend.close()


def test_waiting_for_answers_in_flight_instead_of_refusing() -> None:
    """A request that fits once those in flight settle (their answers far below max_tokens) waits for them."""
    backend = ab.create_backend("mock", latency=0.001)
    texts = ["ab"] * 30  # 2 tokens in, 2 out: 4 spent each; the worst case reserves 2 + 100
    results = ab.run_batch(
        backend, requests(texts, max_tokens=100), budget=ab.Budget(tokens=200), concurrency=8,
        return_exceptions=True,
    )  # fmt: skip
    # Sent while 4 * k spent + 102 fits in 200: k = 0..24, 25 requests, though 8 workers want to send at
    # once (reserving 102 each, fewer can be in flight); the 26th cannot fit even with nothing in flight.
    done = [r for r in results if isinstance(r, ab.GenerationResult)]
    assert len(done) == 25 and sent(backend) == 25
    assert all(isinstance(r, ab.BudgetExceededError) for r in results if r not in done)
    backend.close()


def test_a_cost_budget_through_a_backend_without_prices_is_refused_before_anything_is_sent() -> None:
    backend = ab.create_backend("mock")
    with pytest.raises(ab.InvalidRequestError, match=r"pricing=ab\.Pricing"):
        ab.run_batch(backend, requests(prompts(3)), budget=ab.Budget(cost=1.0))
    assert sent(backend) == 0
    # A token budget needs no prices.
    assert len(ab.run_batch(backend, requests(prompts(3)), budget=ab.Budget(tokens=10_000))) == 3
    backend.close()


def test_the_prices_are_found_through_wrappers() -> None:
    inner = ab.create_backend("mock", pricing=PRICES)
    assert inner.pricing == PRICES  # type: ignore[attr-defined]
    for outer in (
        ab.limited(inner, concurrency=4),
        ab.pool([inner, ab.create_backend("mock", pricing=PRICES)]),
    ):
        metrics = ab.RunMetrics()
        ab.run_batch(outer, requests(prompts(10)), budget=ab.Budget(cost=1.0), metrics=metrics)
        expected = bill([mock_tokens(t, 16) for t in prompts(10)])
        assert metrics.cost is not None and abs(Decimal(repr(metrics.cost)) - expected) < Decimal("1e-12")
    # Replicas priced differently: the pool states no price of its own, so a cost budget is refused.
    mixed = ab.pool([inner, ab.create_backend("mock", pricing=ab.Pricing(input=1, output=1))])
    with pytest.raises(ab.InvalidRequestError, match="pricing"):
        ab.run_batch(mixed, requests(prompts(2)), budget=ab.Budget(cost=1.0))


def test_bad_budgets_and_prices_are_clear_errors() -> None:
    with pytest.raises(ab.InvalidRequestError, match=r"Budget\.tokens"):
        ab.Budget(tokens=-1)
    with pytest.raises(ab.InvalidRequestError, match=r"Budget\.cost"):
        ab.Budget(cost=float("nan"))
    with pytest.raises(ab.InvalidRequestError, match=r"Pricing\.output"):
        ab.Pricing(input=1.0, output=-2.0)
    with pytest.raises(ab.InvalidRequestError, match="output must be given"):
        ab.create_backend("mock", pricing={"input": 1})
    with pytest.raises(ab.InvalidRequestError, match="unknown field 'cached'"):
        ab.create_backend("mock", pricing={"input": 1, "output": 2, "cached": 0.1})
    with pytest.raises(ab.InvalidRequestError, match=r"pricing must be an ab\.Pricing or a mapping"):
        ab.create_backend("mock", pricing=1.5)
    priced = ab.create_backend("mock", pricing={"input": 1, "output": 2})  # a model-args string's mapping
    assert priced.pricing == ab.Pricing(input=1, output=2)  # type: ignore[attr-defined]
    with pytest.raises(ab.InvalidRequestError, match="budget must be a Budget"):
        ab.run_batch(ab.create_backend("mock"), [], budget=100)  # type: ignore[arg-type]
    with pytest.raises(ab.InvalidRequestError, match="batch=True"):
        ab.RunOptions(batch=True, budget=ab.Budget(tokens=1))


def test_as_completed_and_gather_keep_the_budget_too() -> None:
    backend = ab.create_backend("mock")
    texts = prompts(20)
    each = sum(mock_tokens(texts[0], 16))

    async def main() -> tuple[int, int]:
        got = [o async for _, o in ab.as_completed(backend, requests(texts), budget=ab.Budget(tokens=each * 5),
                                                  return_exceptions=True)]  # fmt: skip
        gathered = await ab.gather(backend, requests(texts), budget=ab.Budget(tokens=each * 7),
                                   return_exceptions=True)  # fmt: skip
        ok = lambda xs: sum(isinstance(x, ab.GenerationResult) for x in xs)  # noqa: E731
        return ok(got), ok(gathered)

    assert asyncio.run(main()) == (5, 7)
    backend.close()


def test_a_limited_backends_budget_is_one_for_every_run_through_it() -> None:
    inner = ab.create_backend("mock")
    texts = prompts(40)
    each = sum(mock_tokens(texts[0], 16))
    shared = ab.limited(inner, budget=ab.Budget(tokens=each * 25))
    first = ab.run_batch(shared, requests(texts[:15]))  # 15 of the 25 the budget covers
    second = ab.run_batch(shared, requests(texts[15:]), return_exceptions=True)
    assert len(first) == 15
    done = [r for r in second if isinstance(r, ab.GenerationResult)]
    refused = [r for r in second if isinstance(r, ab.BudgetExceededError)]
    assert len(done) == 10 and len(refused) == 15  # the second run had what the first left
    assert sent(inner) == 25
    # A direct call through the wrapper is held to the same budget.
    with pytest.raises(ab.BudgetExceededError):
        ab.get_loop_manager().run(shared.generate(requests(texts[:1])[0]))
    with pytest.raises(ab.InvalidRequestError, match="pricing"):
        ab.limited(inner, budget=ab.Budget(cost=1.0))  # refused when built, before any run
    shared.close()


def test_an_lm_eval_run_through_a_limited_backend_stops_at_its_budget() -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from asyncbackends.integrations.lm_eval import AsyncBackendsLM

    inner = ab.create_backend("mock")
    lm = AsyncBackendsLM(ab.limited(inner, budget=ab.Budget(tokens=300)), progress=False)
    instances = [
        Instance("generate_until", {}, (f"prompt number {i}", {"until": ["\n\n"], "max_gen_toks": 8}), i)
        for i in range(40)
    ]
    with pytest.raises(ab.BudgetExceededError, match="larger budget"):
        lm.generate_until(instances)
    assert 0 < sent(inner) < 40


def test_an_lm_eval_model_args_string_gives_prices_and_one_budget_for_the_evaluation() -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from asyncbackends.integrations.lm_eval import AsyncBackendsLM

    lm = AsyncBackendsLM.create_from_arg_string(
        "backend=mock,progress=False,budget_cost=0.0003,price_input=1.0,price_output=2.0"
    )
    assert lm.backend.pricing == ab.Pricing(input=1.0, output=2.0)  # type: ignore[attr-defined]
    first = [
        Instance("generate_until", {}, (f"a {i:02d}", {"until": ["\n"], "max_gen_toks": 4}), i)
        for i in range(5)
    ]
    assert len(lm.generate_until(first)) == 5  # a first run of the evaluation, within the budget
    more = [
        Instance("generate_until", {}, (f"prompt {i:03d}", {"until": ["\n"], "max_gen_toks": 8}), i)
        for i in range(40)
    ]
    with pytest.raises(ab.BudgetExceededError):  # a later run shares what the first one spent
        lm.generate_until(more)
    with pytest.raises(ab.InvalidRequestError, match="needs the backend's prices"):
        AsyncBackendsLM.create_from_arg_string("backend=mock,budget_cost=1")
