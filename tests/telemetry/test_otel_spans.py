"""Spans and metrics of a run, read back through the OpenTelemetry SDK's in-memory exporter and reader."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

import asyncbackends as ab
from asyncbackends._observability.observe import note_replica
from asyncbackends._observability.observers import run_observer
from asyncbackends._observability.telemetry import DURATION_BUCKETS, TOKEN_BUCKETS
from asyncbackends._observability.telemetry import record_replica_state as replica_state

from .conftest import OTel, reset_globals

FAST_RETRY = ab.RetryPolicy(max_attempts=3, initial_delay=0.0, jitter=False)


def test_one_span_per_request_named_and_attributed_by_the_conventions(otel: OTel, make_mock: Any) -> None:
    backend = make_mock(model="echo-1")
    params = ab.SamplingParams(max_tokens=3, temperature=0.5, top_p=0.9, top_k=5, seed=7, stop=("z",), n=2)
    requests = [ab.GenerationRequest(f"prompt {i}", params, request_id=f"r{i}") for i in range(5)]
    requests.append(ab.GenerationRequest([{"role": "user", "content": "hi"}]))
    ab.run_batch(backend, requests)
    spans = otel.finished()
    assert len(spans) == 6
    names = sorted(s.name for s in spans)
    assert names == ["chat echo-1"] + ["text_completion echo-1"] * 5
    span = next(s for s in spans if s.name.startswith("text_completion"))
    assert span.kind is SpanKind.INTERNAL  # the mock runs in this process
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.operation.name"] == "text_completion"
    assert attributes["gen_ai.provider.name"] == "mock"
    assert attributes["gen_ai.request.model"] == "echo-1"
    assert attributes["gen_ai.request.max_tokens"] == 3
    assert attributes["gen_ai.request.temperature"] == 0.5
    assert attributes["gen_ai.request.top_p"] == 0.9
    assert attributes["gen_ai.request.top_k"] == 5
    assert attributes["gen_ai.request.seed"] == 7
    assert attributes["gen_ai.request.stop_sequences"] == ("z",)
    assert attributes["gen_ai.request.choice.count"] == 2
    assert attributes["gen_ai.response.finish_reasons"] == ("length", "length")
    assert attributes["gen_ai.usage.input_tokens"] == len("prompt 0")
    assert attributes["gen_ai.usage.output_tokens"] == 6  # 3 tokens x 2 completions
    assert attributes["gen_ai.response.model"] == "echo-1"
    assert "error.type" not in attributes
    assert span.status.status_code is StatusCode.UNSET
    events = [e for e in span.events if e.name == "asyncbackends.attempt"]
    assert len(events) == 1 and events[0].attributes["asyncbackends.attempt"] == 1


def test_loglikelihood_spans_name_their_operation(otel: OTel, mock: Any) -> None:
    ab.run_batch(mock, [ab.LoglikelihoodRequest("a b", " c"), ab.RollingLoglikelihoodRequest("abc")])
    assert sorted(s.name for s in otel.finished()) == [
        "loglikelihood mock-echo",
        "loglikelihood_rolling mock-echo",
    ]


def test_the_callers_active_span_is_the_parent_whatever_thread_or_loop(otel: OTel, mock: Any) -> None:
    tracer = trace.get_tracer("eval-harness")
    with tracer.start_as_current_span("evaluate task") as parent:
        ab.run_batch(mock, [ab.GenerationRequest("a"), ab.GenerationRequest("b")])

    async def from_another_loop() -> None:
        with tracer.start_as_current_span("async task"):
            await ab.gather(mock, [ab.GenerationRequest("c")])
            async for _ in ab.as_completed(mock, [ab.GenerationRequest("d")]):
                pass

    asyncio.run(from_another_loop())
    spans = {s.name: s for s in otel.finished() if not s.name.startswith("text_completion")}
    children = [s for s in otel.finished() if s.name.startswith("text_completion")]
    assert len(children) == 4
    sync_parent = parent.get_span_context()
    async_parent = spans["async task"].context
    by_parent: dict[int, int] = {}
    for child in children:
        assert child.parent is not None
        assert child.context.trace_id == child.parent.trace_id
        by_parent[child.parent.span_id] = by_parent.get(child.parent.span_id, 0) + 1
    assert by_parent == {sync_parent.span_id: 2, async_parent.span_id: 2}


def test_without_a_caller_span_each_request_is_a_root(otel: OTel, mock: Any) -> None:
    ab.run_batch(mock, [ab.GenerationRequest("a"), ab.GenerationRequest("b")])
    spans = otel.finished()
    assert [s.parent for s in spans] == [None, None]
    assert spans[0].context.trace_id != spans[1].context.trace_id


def test_attempts_and_retries_are_events_with_reason_and_retry_after(otel: OTel, make_mock: Any) -> None:
    backend = make_mock(fail_attempts=2, failure="rate_limited", retry_after=0.01)
    [result] = ab.run_batch(backend, [ab.GenerationRequest("x", request_id="r")], retry=FAST_RETRY)
    assert isinstance(result, ab.GenerationResult)
    [span] = otel.finished()
    attempts = [e for e in span.events if e.name == "asyncbackends.attempt"]
    retries = [e for e in span.events if e.name == "asyncbackends.retry"]
    assert [e.attributes["asyncbackends.attempt"] for e in attempts] == [1, 2, 3]
    assert [e.attributes.get("error.type") for e in attempts] == [
        "RateLimitedError",
        "RateLimitedError",
        None,
    ]
    assert [e.attributes["asyncbackends.attempt"] for e in retries] == [1, 2]
    for event in retries:
        assert event.attributes["error.type"] == "RateLimitedError"
        assert event.attributes["asyncbackends.retry.retry_after"] == 0.01
        assert event.attributes["asyncbackends.retry.delay"] >= 0.01  # Retry-After honoured
    assert span.status.status_code is StatusCode.UNSET
    retried = otel.points("asyncbackends.retries")
    assert [(p.attributes["error.type"], p.value) for p in retried] == [("RateLimitedError", 2)]


def test_a_failed_request_has_error_type_and_an_error_status(otel: OTel, make_mock: Any) -> None:
    backend = make_mock(fail_attempts=5, failure="rejected")
    [outcome] = ab.run_batch(backend, [ab.GenerationRequest("x")], return_exceptions=True)
    assert isinstance(outcome, ab.RequestRejectedError)
    [span] = otel.finished()
    assert span.attributes["error.type"] == "RequestRejectedError"
    assert span.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in span.events)
    assert len([e for e in span.events if e.name == "asyncbackends.attempt"]) == 1  # never retried
    [failed] = otel.points("gen_ai.client.operation.duration")
    assert failed.attributes["error.type"] == "RequestRejectedError"


def test_requests_cancelled_with_the_run_end_their_spans(otel: OTel) -> None:
    gate = asyncio.Event()

    class FailsOne(ab.BaseBackend):
        name = "failsone"
        capabilities = ab.Capabilities()

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            if request.request_id == "bad":
                raise ab.RequestRejectedError("no", request_id="bad")
            await gate.wait()  # never set: these are cancelled when "bad" fails
            raise AssertionError("unreachable")

    requests = [ab.GenerationRequest("x", request_id=f"r{i}") for i in range(3)]
    with pytest.raises(ab.RequestRejectedError):
        ab.run_batch(FailsOne(), [*requests, ab.GenerationRequest("x", request_id="bad")])
    spans = otel.finished()
    assert len(spans) == 4
    assert sorted(s.attributes["error.type"] for s in spans) == ["CancelledError"] * 3 + [
        "RequestRejectedError"
    ]
    [in_flight] = otel.points("asyncbackends.requests.in_flight")
    assert in_flight.value == 0


def test_a_server_backend_gets_client_spans_with_its_address(otel: OTel) -> None:
    class Remote(ab.BaseBackend):
        name = "remote"
        capabilities = ab.Capabilities()
        base_url = "http://127.0.0.1:8123/v1"
        model = "served-model"

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            return ab.GenerationResult(request.request_id, (ab.Completion("ok", (1,), None, "stop"),), 2)

    ab.run_batch(Remote(), [ab.GenerationRequest("x")])
    [span] = otel.finished()
    assert span.kind is SpanKind.CLIENT
    assert span.name == "text_completion served-model"
    assert span.attributes["server.address"] == "127.0.0.1"
    assert span.attributes["server.port"] == 8123


def test_metrics_follow_the_conventions(otel: OTel, make_mock: Any, tmp_path: Any) -> None:
    backend = make_mock()
    requests = [ab.GenerationRequest(f"hell{i}", ab.SamplingParams(max_tokens=3)) for i in range(4)]
    cache = tmp_path / "c.sqlite"
    ab.run_batch(backend, requests[:2], cache=cache)
    ab.run_batch(backend, requests, cache=cache)  # two are cache hits
    [duration] = otel.points("gen_ai.client.operation.duration")
    assert duration.count == 6
    assert tuple(duration.explicit_bounds) == DURATION_BUCKETS
    assert duration.attributes == {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.provider.name": "mock",
        "gen_ai.request.model": "mock-echo",
    }
    tokens = {p.attributes["gen_ai.token.type"]: p for p in otel.points("gen_ai.client.token.usage")}
    assert tuple(tokens["input"].explicit_bounds) == TOKEN_BUCKETS
    assert tokens["input"].count == 6 and tokens["input"].sum == 6 * len("hello")
    assert tokens["output"].sum == 6 * 3
    [hits] = otel.points("asyncbackends.cache.hits")
    assert hits.value == 2
    [in_flight] = otel.points("asyncbackends.requests.in_flight")
    assert in_flight.value == 0
    [slot_wait] = otel.points("asyncbackends.slot.wait.duration")
    assert slot_wait.count == 6


def test_rate_limiter_waits_are_measured(otel: OTel, mock: Any) -> None:
    requests = [ab.GenerationRequest(str(i)) for i in range(4)]
    ab.run_batch(mock, requests, rate_limit=ab.RateLimit(requests_per_second=50))
    [waits] = otel.points("asyncbackends.rate_limit.wait.duration")
    assert waits.count == 4
    # A burst of one second's worth (50) passes at once: the waits exist but are short.
    assert waits.sum < 1.0


def test_replica_notes_and_states(otel: OTel) -> None:
    class OneReplica(ab.BaseBackend):
        name = "pool"
        capabilities = ab.Capabilities()

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            note_replica("replica-a")
            return ab.GenerationResult(request.request_id, (ab.Completion("ok"),))

    ab.run_batch(OneReplica(), [ab.GenerationRequest("x")])
    [span] = otel.finished()
    assert span.attributes["asyncbackends.replica"] == "replica-a"
    replica_state("p", "replica-a", "healthy")
    replica_state("p", "replica-a", "cooling", previous="healthy")
    states = {
        p.attributes["asyncbackends.replica.state"]: p.value
        for p in otel.points("asyncbackends.replica.state")
    }
    assert states == {"healthy": 0, "cooling": 1}


def test_no_sdk_means_no_observer(mock: Any) -> None:
    reset_globals()  # the API is imported (this module imports it) but no provider is set
    assert run_observer(mock) is None
    assert run_observer(mock, ab.RunCallbacks()) is not None
