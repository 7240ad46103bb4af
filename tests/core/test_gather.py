from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncbackends as ab
from asyncbackends.adapters.mock import MockBackend


def requests(n: int, prefix: str = "p") -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"{prefix}{i}", request_id=f"{prefix}{i}") for i in range(n)]


class RecordingBackend(ab.BaseBackend):
    """Random latency; records the loop and thread every call ran on and what was in flight."""

    name = "recording"

    def __init__(self, seed: int = 0, max_latency: float = 0.002) -> None:
        self.rng = random.Random(seed)
        self.max_latency = max_latency
        self.calls: list[str | None] = []
        self.loops: set[int] = set()
        self.threads: set[int] = set()
        self.in_flight = self.max_in_flight = 0
        self.capabilities = ab.Capabilities(loglikelihood=True)

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.calls.append(request.request_id)
        self.loops.add(id(asyncio.get_running_loop()))
        self.threads.add(threading.get_ident())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.rng.uniform(0, self.max_latency))
        finally:
            self.in_flight -= 1
        return ab.GenerationResult(request.request_id, (ab.Completion(str(request.prompt)),))

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        return ab.LoglikelihoodResult(request.request_id, -float(len(request.continuation)), True, 1)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 300), concurrency=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_order_exactly_once_and_bound_under_random_latency(n: int, concurrency: int, seed: int) -> None:
    backend = RecordingBackend(seed)
    batch = requests(n)
    results = ab.run_batch(backend, batch, concurrency=concurrency)
    assert [r.request_id for r in results] == [r.request_id for r in batch]
    assert sorted(backend.calls, key=str) == sorted((r.request_id for r in batch), key=str)
    assert len(backend.calls) == n
    assert backend.max_in_flight <= concurrency
    if n >= concurrency * 3:
        assert backend.max_in_flight == concurrency  # the pool is actually used


def test_concurrency_defaults_to_the_backend_hint(make_mock: Any) -> None:
    hinted = make_mock(latency=0.01, max_concurrency=5)
    ab.run_batch(hinted, requests(40))
    assert hinted.max_in_flight == 5
    default = make_mock(latency=0.01)
    ab.run_batch(default, requests(200))
    assert default.max_in_flight == ab.DEFAULT_CONCURRENCY


def test_mixed_requests_dispatch_on_type(mock: MockBackend) -> None:
    batch: list[Any] = [
        ab.GenerationRequest("abc"),
        ab.LoglikelihoodRequest("abc", "a"),
        ab.RollingLoglikelihoodRequest("hello"),
    ]
    generated, scored, rolled = ab.run_batch(mock, batch)
    assert isinstance(generated, ab.GenerationResult) and generated.text == "abc"
    assert isinstance(scored, ab.LoglikelihoodResult) and scored.is_greedy is True
    assert isinstance(rolled, ab.LoglikelihoodResult) and rolled.num_tokens == 5


def test_unsupported_request_type_is_an_invalid_request() -> None:
    backend = RecordingBackend()
    outcomes = ab.run_batch(backend, [ab.RollingLoglikelihoodRequest("x")], return_exceptions=True)
    assert isinstance(outcomes[0], ab.RequestRejectedError)  # BaseBackend's default refusal
    bare = type("Bare", (), {"name": "bare", "capabilities": ab.Capabilities()})()
    outcomes = ab.run_batch(bare, [ab.RollingLoglikelihoodRequest("x")], return_exceptions=True)
    assert isinstance(outcomes[0], ab.InvalidRequestError) and "loglikelihood_rolling" in str(outcomes[0])
    outcomes = ab.run_batch(bare, ["just a prompt"], return_exceptions=True)  # type: ignore[list-item]
    assert isinstance(outcomes[0], ab.InvalidRequestError) and "GenerationRequest" in str(outcomes[0])
    with pytest.raises(ab.InvalidRequestError, match="not a string"):
        ab.run_batch(bare, "prompt")  # type: ignore[arg-type]


def test_retries_only_retryable_errors(make_mock: Any) -> None:
    fast = ab.RetryPolicy(max_attempts=4, initial_delay=0.001)
    flaky = make_mock(fail_attempts=2, failure="unavailable")
    results = ab.run_batch(flaky, requests(10), retry=fast)
    assert [r.text for r in results] == [f"p{i}" for i in range(10)]
    assert all(flaky.attempts[f"p{i}"] == 3 for i in range(10))

    rejected = make_mock(fail_attempts=1, failure="rejected")
    outcomes = ab.run_batch(rejected, requests(5), retry=fast, return_exceptions=True)
    assert all(isinstance(o, ab.RequestRejectedError) for o in outcomes)
    assert all(rejected.attempts[f"p{i}"] == 1 for i in range(5))  # 4xx-style: never retried

    broken = make_mock(fail_attempts=1, failure="broken")
    outcomes = ab.run_batch(broken, requests(3), retry=fast, return_exceptions=True)
    assert all(isinstance(o, ab.BackendBrokenError) for o in outcomes)
    assert all(broken.attempts[f"p{i}"] == 1 for i in range(3))


def test_exhausted_retries_report_that_request_without_failing_others(make_mock: Any) -> None:
    backend = make_mock(fail_attempts=5, failure="server")
    good = make_mock()
    metrics = ab.RunMetrics()
    outcomes = ab.run_batch(
        backend,
        requests(3),
        retry=ab.RetryPolicy(max_attempts=3, initial_delay=0),
        return_exceptions=True,
        metrics=metrics,
    )
    assert all(type(o) is ab.BackendError and o.request_id == f"p{i}" for i, o in enumerate(outcomes))
    assert all(o.backend == "mock" for o in outcomes)
    assert metrics.retries == 6 and metrics.errors == {"BackendError": 3}
    assert ab.run_batch(good, requests(2))[1].text == "p1"


def test_retry_after_is_honoured_and_capped(make_mock: Any) -> None:
    backend = make_mock(fail_attempts=1, failure="rate_limited", retry_after=0.3)
    start = time.perf_counter()
    ab.run_batch(backend, requests(3), retry=ab.RetryPolicy(initial_delay=0, max_delay=10))
    assert time.perf_counter() - start >= 0.3

    capped = make_mock(fail_attempts=1, failure="rate_limited", retry_after=1000)
    start = time.perf_counter()
    ab.run_batch(capped, requests(2), retry=ab.RetryPolicy(initial_delay=0, max_delay=0.05))
    assert time.perf_counter() - start < 5


def test_retry_policy_delays_grow_with_full_jitter() -> None:
    policy = ab.RetryPolicy(initial_delay=1, max_delay=5, jitter=False)
    error = ab.BackendError("x")
    assert [policy.delay(a, error) for a in (1, 2, 3, 4)] == [1, 2, 4, 5]
    jittered = ab.RetryPolicy(initial_delay=1, max_delay=5)
    rng = random.Random(0)
    draws = [jittered.delay(3, error, rng) for _ in range(200)]
    assert all(0 <= d <= 4 for d in draws) and max(draws) - min(draws) > 2
    limited = ab.RateLimitedError("x", retry_after=3)
    assert ab.RetryPolicy(initial_delay=0).delay(1, limited) == 3
    with pytest.raises(ab.InvalidRequestError):
        ab.RetryPolicy(max_attempts=0)


def test_timeout_is_per_attempt_and_excludes_queueing(make_mock: Any) -> None:
    # Five 0.1 s requests through one slot take 0.5 s, yet none times out at 0.3 s: queueing is free.
    backend = make_mock(latency=0.1)
    results = ab.run_batch(backend, requests(5), concurrency=1, timeout=0.3)
    assert len(results) == 5

    slow = make_mock(latency=1.0)
    start = time.perf_counter()
    outcomes = ab.run_batch(
        slow,
        requests(2),
        timeout=0.05,
        retry=ab.RetryPolicy(max_attempts=2, initial_delay=0),
        return_exceptions=True,
    )
    assert all(isinstance(o, ab.BackendTimeoutError) and isinstance(o, TimeoutError) for o in outcomes)
    assert all(slow.attempts[f"p{i}"] == 2 for i in range(2))  # timeouts are retryable
    assert time.perf_counter() - start < 0.9
    assert slow.cancelled == 4


def test_first_error_cancels_the_rest_and_is_raised(make_mock: Any) -> None:
    class FailOnThird(MockBackend):
        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            if request.request_id == "p2":
                raise ab.RequestRejectedError("no", request_id="p2")
            return await super().generate(request)

    backend = FailOnThird(latency=5)
    start = time.perf_counter()
    with pytest.raises(ab.RequestRejectedError) as info:
        ab.run_batch(backend, requests(10), concurrency=4)
    assert info.value.request_id == "p2" and info.value.backend == "mock"
    assert time.perf_counter() - start < 2
    assert backend.cancelled == 3 and backend.in_flight == 0


def test_failed_items_are_errors_never_empty_results(make_mock: Any) -> None:
    backend = make_mock(failure_rate=0.5, failure="rejected", seed=3)
    outcomes = ab.run_batch(backend, requests(50), return_exceptions=True)
    errors = [o for o in outcomes if isinstance(o, ab.AsyncBackendsError)]
    results = [o for o in outcomes if isinstance(o, ab.GenerationResult)]
    assert errors and results and len(errors) + len(results) == 50
    assert all(r.text == r.request_id for r in results)


def test_raw_exceptions_from_an_adapter_are_wrapped() -> None:
    class Leaky(RecordingBackend):
        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            raise KeyError("engine internals")

    outcomes = ab.run_batch(Leaky(), requests(2), return_exceptions=True)
    assert all(type(o) is ab.BackendError and isinstance(o.__cause__, KeyError) for o in outcomes)
    assert all(not o.retryable for o in outcomes)


def test_cancelling_the_caller_cancels_every_in_flight_request(make_mock: Any) -> None:
    backend = make_mock(latency=30)

    async def main() -> None:
        task = asyncio.ensure_future(ab.gather(backend, requests(50), concurrency=10))
        while backend.in_flight < 10:  # noqa: ASYNC110  (the state lives in another loop's thread)
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    # The cancelled caller returned only after the shared loop had finished cancelling: nothing to wait for.
    assert backend.in_flight == 0 and backend.cancelled == 10 and backend.completed == 0


def test_gather_from_foreign_loops_runs_on_the_shared_loop() -> None:
    backend = RecordingBackend()

    async def main() -> list[Any]:
        return await ab.gather(backend, requests(20))

    first = asyncio.run(main())
    second = asyncio.run(main())  # a second asyncio.run: the seed's bug with vLLM
    assert [r.text for r in first] == [r.text for r in second] == [f"p{i}" for i in range(20)]
    shared = id(ab.get_loop_manager().loop)
    assert backend.loops == {shared}
    assert len(backend.threads) == 1


def test_run_batch_twice_in_a_row_reuses_the_loop(mock: MockBackend) -> None:
    first = ab.run_batch(mock, requests(5))
    second = ab.run_batch(mock, requests(5))
    assert [r.text for r in first] == [r.text for r in second]


def test_as_completed_yields_every_index_once(make_mock: Any) -> None:
    backend = make_mock(latency=0.01, jitter=0.02)

    async def main() -> list[tuple[int, Any]]:
        return [item async for item in ab.as_completed(backend, requests(30), concurrency=7)]

    items = asyncio.run(main())
    assert sorted(i for i, _ in items) == list(range(30))
    assert all(outcome.text == f"p{i}" for i, outcome in items)


def test_as_completed_on_the_shared_loop_and_early_break(make_mock: Any) -> None:
    backend = make_mock(latency=0.05)

    async def main() -> int:
        seen = 0
        async with contextlib.aclosing(ab.as_completed(backend, requests(40), concurrency=4)) as items:
            async for _index, _outcome in items:
                seen += 1
                if seen == 3:
                    break
        return seen

    assert ab.get_loop_manager().run(main()) == 3
    assert backend.in_flight == 0 and backend.completed < 40 and backend.cancelled > 0


def test_as_completed_abandoned_without_aclosing_still_cancels(make_mock: Any) -> None:
    backend = make_mock(latency=0.05)

    async def main() -> None:
        async for _ in ab.as_completed(backend, requests(40), concurrency=4):
            break

    asyncio.run(main())  # asyncio.run finalises abandoned async generators before it returns
    deadline = time.monotonic() + 5
    while backend.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.in_flight == 0 and backend.completed < 40


def test_as_completed_cancelled_while_waiting_leaves_no_pending_task(
    make_mock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Ctrl-C on `asyncbackends run` cancels the consumer while it waits for the next outcome, on the shared
    # loop (which, unlike asyncio.run, does not sweep up tasks left behind): nothing may stay pending there,
    # or "Task was destroyed but it is pending!" is printed once it is collected.
    backend = make_mock(latency=30)
    manager = ab.get_loop_manager()

    async def consume() -> None:
        async for _ in ab.as_completed(backend, requests(2)):
            pass

    async def main() -> list[str]:
        before = asyncio.all_tasks()
        consumer = asyncio.create_task(consume())
        while backend.in_flight < 2:  # noqa: ASYNC110  (the state is a counter the backend bumps)
            await asyncio.sleep(0.005)
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        await asyncio.sleep(0)  # let cancelled tasks finish cancelling
        return [
            repr(t) for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()
        ]

    assert manager.run(main()) == []
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
        manager.run(asyncio.sleep(0))
    assert "Task was destroyed but it is pending" not in caplog.text


def test_as_completed_raises_the_first_error(make_mock: Any) -> None:
    backend = make_mock(fail_attempts=1, failure="rejected")

    async def main() -> None:
        async for _ in ab.as_completed(backend, requests(3)):
            pass

    with pytest.raises(ab.RequestRejectedError):
        asyncio.run(main())


def test_rate_limit_requests_per_second(mock: MockBackend) -> None:
    start = time.perf_counter()
    ab.run_batch(mock, requests(30), rate_limit=ab.RateLimit(requests_per_second=40))
    elapsed = time.perf_counter() - start
    # Bucket of 40 starts full, so 30 requests pass at once; 70 need about (70 - 40) / 40 s more.
    assert elapsed < 0.7  # a bucket starting empty would need 30 / 40 = 0.75 s
    start = time.perf_counter()
    ab.run_batch(mock, requests(70), rate_limit=ab.RateLimit(requests_per_second=40))
    assert 0.6 <= time.perf_counter() - start < 3


def test_rate_limit_tokens_per_minute(mock: MockBackend) -> None:
    # Each request: 4-character prompt = 1 token + max_tokens 59 = 60 tokens. 6000/min is 100 tokens/s
    # with a full minute's bucket: the first 100 requests pass at once, the last 2 wait 0.6 s each.
    batch = [ab.GenerationRequest("abcd", ab.SamplingParams(max_tokens=59)) for _ in range(102)]
    start = time.perf_counter()
    ab.run_batch(mock, batch, rate_limit=ab.RateLimit(tokens_per_minute=6000))
    assert 1.0 <= time.perf_counter() - start < 4
    with pytest.raises(ab.InvalidRequestError):
        ab.RateLimit(requests_per_second=0)


def test_metrics_summary(make_mock: Any) -> None:
    backend = make_mock(latency=0.01, fail_attempts=1, failure="unavailable")
    updates: list[int] = []
    metrics = ab.RunMetrics(on_update=lambda m: updates.append(m.successes))
    ab.run_batch(backend, requests(10), metrics=metrics, retry=ab.RetryPolicy(initial_delay=0))
    summary = metrics.summary()
    assert summary["requests"] == 10 and summary["successes"] == 10 and summary["retries"] == 10
    assert summary["completion_tokens"] == sum(len(f"p{i}") for i in range(10))
    # Latencies are read from state, not compared with a wall-clock guess (timers may wake a little early).
    assert len(metrics._latencies) == 10 and all(latency > 0 for latency in metrics._latencies)
    assert 0 < summary["latency_p50_s"] <= summary["latency_p95_s"] <= summary["latency_p99_s"] < 10
    assert summary["requests_per_s"] > 0 and summary["cache_read_failures"] == 0
    assert updates == list(range(1, 11))
    assert "requests: 10" in metrics.format()


def test_progress_bar_shows_rate(mock: MockBackend, capsys: pytest.CaptureFixture[str]) -> None:
    ab.run_batch(mock, requests(20), progress="scoring")
    err = capsys.readouterr().err
    assert "scoring" in err and "20/20" in err and "req/s" in err


def test_create_backend_accepts_any_protocol_object() -> None:
    ab.register_backend("recording-test", f"{__name__}:RecordingBackend", replace=True)
    backend = ab.create_backend("recording-test", seed=1)
    assert isinstance(backend, ab.AsyncBackend)
    assert ab.run_batch(backend, requests(3))[2].text == "p2"


def test_adapter_leaking_a_plain_timeout_error_is_a_retryable_timeout() -> None:
    class SelfTimed(RecordingBackend):
        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            self.calls.append(request.request_id)
            raise TimeoutError("read timed out")

    backend = SelfTimed()
    outcomes = ab.run_batch(
        backend, requests(1), retry=ab.RetryPolicy(max_attempts=2, initial_delay=0), return_exceptions=True
    )
    assert isinstance(outcomes[0], ab.BackendTimeoutError) and len(backend.calls) == 2


def test_timeouts_fire_close_to_their_deadline(make_mock: Any) -> None:
    backend = make_mock(latency=5)
    start = time.perf_counter()
    outcomes = ab.run_batch(
        backend, requests(3), timeout=0.2, retry=ab.RetryPolicy(max_attempts=1), return_exceptions=True
    )
    elapsed = time.perf_counter() - start
    assert all(isinstance(o, ab.BackendTimeoutError) for o in outcomes)
    assert 0.2 <= elapsed < 2.0  # not the mock's 5 s: room for a loaded machine's scheduling


def test_caller_cancellation_wins_over_an_expiring_attempt(make_mock: Any) -> None:
    backend = make_mock(latency=5)

    async def main() -> None:
        task = asyncio.ensure_future(ab.gather(backend, requests(4), timeout=0.3))
        await asyncio.sleep(0.29)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while backend.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.in_flight == 0 and backend.completed == 0


def test_an_expired_attempt_is_a_timeout_whatever_the_adapter_made_of_the_cancel() -> None:
    class MapsCancel(RecordingBackend):
        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            self.calls.append(request.request_id)
            try:
                await asyncio.sleep(2)
            except asyncio.CancelledError:
                raise ab.BackendUnavailableError("connection closed") from None
            return ab.GenerationResult(request.request_id, (ab.Completion("late"),))

    backend = MapsCancel()
    start = time.perf_counter()
    outcomes = ab.run_batch(
        backend,
        requests(1),
        timeout=0.1,
        retry=ab.RetryPolicy(max_attempts=3, initial_delay=0),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], ab.BackendTimeoutError)
    assert len(backend.calls) == 3  # every attempt was timed, not only the first
    assert time.perf_counter() - start < 1.5


def test_unweakreferenceable_backends_can_be_created() -> None:
    ab.register_backend("slotted-test", f"{__name__}:Slotted", replace=True)
    backend = ab.create_backend("slotted-test")
    assert ab.run_batch(backend, requests(2))[1].text == "slotted"


class Slotted:
    __slots__ = ("capabilities", "name")

    def __init__(self) -> None:
        self.name = "slotted"
        self.capabilities = ab.Capabilities()

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        return ab.GenerationResult(request.request_id, (ab.Completion("slotted"),))

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        raise ab.RequestRejectedError("no")

    async def aclose(self) -> None:
        return None


# gather and as_completed apply every option they take (found by mutation testing: dropping one passed).


async def via_as_completed(backend: Any, batch: list[ab.GenerationRequest], **options: Any) -> list[Any]:
    found = dict([item async for item in ab.as_completed(backend, batch, **options)])
    return [found[index] for index in sorted(found)]


ENTRY_POINTS = {"gather": ab.gather, "as_completed": via_as_completed}


@pytest.fixture(params=sorted(ENTRY_POINTS))
def entry(request: pytest.FixtureRequest) -> Any:
    """Run a batch through one async entry point from a foreign loop; returns outcomes in input order."""
    send = ENTRY_POINTS[request.param]
    return lambda backend, batch, **options: asyncio.run(send(backend, batch, **options))


class Slow(ab.BaseBackend):
    """Answers after five seconds, far beyond the tests' per-attempt timeout."""

    name = "slow"

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        await asyncio.sleep(5)
        return ab.GenerationResult(request.request_id, (ab.Completion("late"),))


def test_entry_points_apply_the_retry_policy(entry: Any, make_mock: Any) -> None:
    flaky = make_mock(fail_attempts=1, failure="unavailable")
    outcomes = entry(flaky, requests(2), retry=ab.RetryPolicy(max_attempts=1), return_exceptions=True)
    assert all(isinstance(o, ab.BackendUnavailableError) for o in outcomes)  # not retried
    assert all(flaky.attempts[f"p{i}"] == 1 for i in range(2))


def test_entry_points_raise_the_first_error_unless_asked_to_return_it(entry: Any, make_mock: Any) -> None:
    with pytest.raises(ab.RequestRejectedError):
        entry(make_mock(fail_attempts=1, failure="rejected"), requests(2))


def test_entry_points_apply_the_per_attempt_timeout(entry: Any) -> None:
    once = ab.RetryPolicy(max_attempts=1)
    outcomes = entry(Slow(), requests(1), timeout=0.05, retry=once, return_exceptions=True)
    assert isinstance(outcomes[0], ab.BackendTimeoutError)


def test_entry_points_apply_the_rate_limit(entry: Any, make_mock: Any) -> None:
    # A bucket of 10 requests a second starts full: the 11th and 12th requests wait 0.1 and 0.2 s for it.
    start = time.perf_counter()
    outcomes = entry(make_mock(), requests(12), rate_limit=ab.RateLimit(requests_per_second=10))
    assert time.perf_counter() - start >= 0.15
    assert [o.text for o in outcomes] == [f"p{i}" for i in range(12)]


def test_entry_points_apply_callbacks_metrics_and_cache(entry: Any, make_mock: Any, tmp_path: Any) -> None:
    done: list[ab.RequestDone] = []
    metrics = ab.RunMetrics()
    batch = requests(3)
    callbacks = ab.RunCallbacks(on_request_done=done.append)
    entry(make_mock(), batch, callbacks=callbacks, metrics=metrics, cache=tmp_path / "c.sqlite")
    assert sorted(event.index for event in done) == [0, 1, 2]
    assert metrics.successes == 3
    again = make_mock()
    entry(again, batch, cache=tmp_path / "c.sqlite")
    assert again.completed == 0  # every answer came from the cache


def test_entry_points_show_a_bar_only_when_asked(
    entry: Any, make_mock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = make_mock()
    entry(backend, requests(3))
    assert "req" not in capsys.readouterr().err
    entry(backend, requests(3), progress="labelled")
    assert "labelled" in capsys.readouterr().err
