"""Fuzzed input: every generated request or option ends in an InvalidRequestError or a result.

Never a hang (each example runs under a deadline), never a dead loop (the shared loop still serves after).
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncbackends as ab
from asyncbackends._cli.main import parse_request

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "wizard", ""]), "content": json_values}
)
prompt = (
    st.text(max_size=40)
    | st.lists(st.integers(-3, 70000), max_size=8)
    | st.lists(message, max_size=3)
    | json_values
)
params = st.dictionaries(
    st.sampled_from(
        ["max_tokens", "temperature", "top_p", "top_k", "stop", "n", "seed", "logprobs", "bogus"]
    ),
    json_values | st.integers(-2, 6) | st.floats(-1, 3),
    max_size=6,
)
record = st.one_of(
    st.fixed_dictionaries(
        {"prompt": prompt}, optional={"params": params | json_values, "request_id": json_values}
    ),
    st.fixed_dictionaries(
        {"type": st.just("loglikelihood")}, optional={"context": json_values, "continuation": json_values}
    ),
    st.fixed_dictionaries({"type": st.just("loglikelihood_rolling")}, optional={"text": json_values}),
    json_values,
)


def _settle(records: list[Any], backend: Any, **options: Any) -> list[Any]:
    requests: list[Any] = []
    for item in records:
        try:
            requests.append(parse_request(json.loads(json.dumps(item, allow_nan=True))))
        except ab.InvalidRequestError:
            continue
    try:
        return ab.run_batch(backend, requests, return_exceptions=True, **options)
    except ab.InvalidRequestError:
        return []


@settings(max_examples=150, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record, max_size=6))
def test_fuzzed_requests_end_in_a_result_or_an_invalid_request(records: list[Any]) -> None:
    backend = ab.create_backend("mock")
    outcomes = _settle(records, backend)
    for outcome in outcomes:
        assert isinstance(outcome, (ab.GenerationResult, ab.LoglikelihoodResult, ab.InvalidRequestError))


def _number_above(value: Any, low: float) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > low
    )


@settings(max_examples=80, deadline=5000)
@given(
    concurrency=st.none() | st.integers(-2, 100) | st.booleans() | st.floats(-1, 5),
    timeout=st.none() | st.floats(-1, 5) | st.integers(-1, 3) | st.text(max_size=3),
    attempts=st.integers(-1, 4),
    # Invalid rates (zero, negative, NaN, infinite, a bool, a string) and valid ones fast enough to finish.
    rps=st.none()
    | st.sampled_from([0, -1, -0.5, math.nan, math.inf, -math.inf, True, "10"])
    | st.floats(500, 1e9),
)
def test_fuzzed_gather_options_are_refused_or_work(
    concurrency: Any, timeout: Any, attempts: int, rps: Any
) -> None:
    valid = (
        (
            concurrency is None
            or (isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1)
        )
        and (timeout is None or _number_above(timeout, 0))
        and attempts >= 1
        and (rps is None or _number_above(rps, 0))
    )
    backend = ab.create_backend("mock")
    requests = [ab.GenerationRequest(f"p{i}") for i in range(5)]
    try:
        retry = ab.RetryPolicy(max_attempts=attempts, initial_delay=0)
        rate = ab.RateLimit(requests_per_second=rps)
        results = ab.run_batch(
            backend, requests, concurrency=concurrency, timeout=timeout, retry=retry, rate_limit=rate
        )
    except ab.InvalidRequestError:
        assert not valid  # refused before sending: only ever a bad option
    except ab.BackendTimeoutError:
        assert valid  # a timeout too small for any attempt
    else:
        assert valid, "a bad option was accepted"
        assert [r.text for r in results] == [f"p{i}" for i in range(5)]
    # The shared loop survives every example.
    assert ab.run_batch(backend, [ab.GenerationRequest("alive")])[0].text == "alive"
