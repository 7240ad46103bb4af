"""A real pool (`ab.pool`) tells the run's observers which replica served each attempt and when one cools."""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab

from .conftest import OTel

FAST_RETRY = ab.RetryPolicy(max_attempts=3, initial_delay=0.0, jitter=False)


def test_pool_replicas_reach_callbacks_spans_and_the_state_gauge(otel: OTel, make_mock: Any) -> None:
    healthy, failing = make_mock(), make_mock(failure_rate=1.0, failure="unavailable")
    pool = ab.pool([healthy, failing])
    try:
        done: list[ab.RequestDone] = []
        retries: list[ab.RetryEvent] = []
        callbacks = ab.RunCallbacks(on_request_done=done.append, on_retry=retries.append)
        requests = [ab.GenerationRequest(f"x{i}", request_id=str(i)) for i in range(12)]
        results = ab.run_batch(pool, requests, retry=FAST_RETRY, callbacks=callbacks, concurrency=4)
        assert all(isinstance(r, ab.GenerationResult) for r in results)
        assert failing.attempts.total() >= 1  # the failing replica was tried, then cooled down
        assert {d.replica for d in done} == {"mock-0"}  # every request ended on the healthy one
        assert retries and {r.replica for r in retries} == {"mock-1"}
        spans = otel.finished()
        assert {s.attributes["asyncbackends.replica"] for s in spans} == {"mock-0"}
        failed_attempts = [
            e.attributes["asyncbackends.replica"]
            for s in spans
            for e in s.events
            if e.name == "asyncbackends.attempt" and "error.type" in e.attributes
        ]
        assert failed_attempts and set(failed_attempts) == {"mock-1"}
        states = {
            (p.attributes["asyncbackends.replica"], p.attributes["asyncbackends.replica.state"]): p.value
            for p in otel.points("asyncbackends.replica.state")
        }
        assert states[("mock-0", "healthy")] == 1
        assert states[("mock-1", "cooling")] == 1 and states[("mock-1", "healthy")] == 0
    finally:
        ab.get_loop_manager().run(pool.aclose())


def test_two_pools_report_their_replicas_under_their_own_names(otel: OTel, make_mock: Any) -> None:
    # The same replica label in two pools; one of them cools down: the other pool's gauge must not change.
    first = ab.pool([make_mock(failure_rate=1.0, failure="unavailable")], cooldown=60, wait=0)
    second = ab.pool([make_mock()])
    try:
        with pytest.raises(ab.BackendUnavailableError):
            ab.get_loop_manager().run(first.generate(ab.GenerationRequest("x")))
        states = {
            (p.attributes["asyncbackends.pool"], p.attributes["asyncbackends.replica.state"]): p.value
            for p in otel.points("asyncbackends.replica.state")
        }
        one, two = first.router.name, second.router.name
        assert one != two and one.startswith("pool-") and two.startswith("pool-")
        assert states[(one, "cooling")] == 1 and states[(one, "healthy")] == 0
        assert states[(two, "healthy")] == 1 and (two, "cooling") not in states
    finally:
        first.close()
        second.close()
