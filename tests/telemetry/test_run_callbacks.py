"""`RunCallbacks`: the run calls plain functions as requests end, retry and use tokens."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._observability.observe import note_replica

FAST_RETRY = ab.RetryPolicy(max_attempts=3, initial_delay=0.0, jitter=False)


def test_every_request_done_with_its_timings_and_outcome(make_mock: Any) -> None:
    backend = make_mock(fail_attempts=1, failure="unavailable")
    done: list[ab.RequestDone] = []
    retries: list[ab.RetryEvent] = []
    usage: list[ab.TokenUsage] = []
    callbacks = ab.RunCallbacks(on_request_done=done.append, on_retry=retries.append, on_usage=usage.append)
    requests = [
        ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=1), request_id=f"r{i}") for i in range(5)
    ]
    results = ab.run_batch(backend, requests, retry=FAST_RETRY, callbacks=callbacks, concurrency=2)
    assert len(done) == 5
    assert sorted(d.index for d in done) == list(range(5))
    for event in done:
        assert event.request_id == f"r{event.index}"
        assert event.outcome is results[event.index]
        assert event.error_type is None and event.attempts == 2 and not event.cached
        assert event.latency_s >= 0 and event.slot_wait_s >= 0 and event.rate_wait_s == 0
    # Concurrency 2: the later requests waited in the run's queue for a worker.
    assert max(d.slot_wait_s for d in done) > 0
    assert len(retries) == 5
    assert {(r.attempt, r.reason, r.retry_after_s) for r in retries} == {(1, "BackendUnavailableError", None)}
    assert all(isinstance(r.error, ab.BackendUnavailableError) for r in retries)
    assert sorted((u.request_id, u.input_tokens, u.output_tokens) for u in usage) == [
        (f"r{i}", 2, 1) for i in range(5)
    ]


def test_failures_and_cache_hits_are_reported(make_mock: Any, tmp_path: Any) -> None:
    done: list[ab.RequestDone] = []
    callbacks = ab.RunCallbacks(on_request_done=done.append)
    requests = [ab.GenerationRequest("same")]
    ab.run_batch(make_mock(), requests, cache=tmp_path / "c.sqlite")
    ab.run_batch(make_mock(), requests, cache=tmp_path / "c.sqlite", callbacks=callbacks)
    ab.run_batch(
        make_mock(fail_attempts=9, failure="rejected"), requests, callbacks=callbacks, return_exceptions=True
    )
    hit, failed = done
    assert hit.cached and hit.attempts == 0 and hit.error_type is None
    assert failed.error_type == "RequestRejectedError" and failed.attempts == 1
    assert isinstance(failed.outcome, ab.RequestRejectedError)


def test_retry_after_reaches_on_retry(make_mock: Any) -> None:
    retries: list[ab.RetryEvent] = []
    backend = make_mock(fail_attempts=1, failure="rate_limited", retry_after=0.02)
    ab.run_batch(
        backend,
        [ab.GenerationRequest("x")],
        retry=FAST_RETRY,
        callbacks=ab.RunCallbacks(on_retry=retries.append),
    )
    [retry] = retries
    assert retry.retry_after_s == 0.02 and retry.delay_s >= 0.02 and retry.reason == "RateLimitedError"


def test_a_raising_callback_is_logged_once_and_the_run_goes_on(
    make_mock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def broken(event: ab.RequestDone) -> None:
        calls.append(event.index)
        raise RuntimeError("tracker down")

    requests = [ab.GenerationRequest(str(i)) for i in range(3)]
    with caplog.at_level(logging.ERROR, logger="asyncbackends._observability.callbacks"):
        results = ab.run_batch(make_mock(), requests, callbacks=ab.RunCallbacks(on_request_done=broken))
    assert all(isinstance(r, ab.GenerationResult) for r in results)
    assert sorted(calls) == [0, 1, 2]
    assert len([r for r in caplog.records if "RunCallbacks" in r.getMessage()]) == 1


def test_the_replica_a_pool_names_reaches_the_callbacks() -> None:
    class TwoReplicas(ab.BaseBackend):
        name = "pool"
        capabilities = ab.Capabilities()

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            note_replica("b" if request.request_id == "1" else "a")
            return ab.GenerationResult(request.request_id, (ab.Completion("ok"),))

    done: list[ab.RequestDone] = []
    requests = [ab.GenerationRequest("x", request_id=str(i)) for i in range(2)]
    ab.run_batch(TwoReplicas(), requests, callbacks=ab.RunCallbacks(on_request_done=done.append))
    assert {d.request_id: d.replica for d in done} == {"0": "a", "1": "b"}


def test_bad_callbacks_are_refused_before_the_run(mock: Any) -> None:
    with pytest.raises(ab.InvalidRequestError, match="must be callable"):
        ab.RunCallbacks(on_retry="print")  # type: ignore[arg-type]
    with pytest.raises(ab.InvalidRequestError, match="callbacks must be a RunCallbacks"):
        ab.run_batch(mock, [ab.GenerationRequest("x")], callbacks=print)
    assert mock.attempts.total() == 0
