"""OpenTelemetry spans and metrics of a run, following the GenAI semantic conventions.

Written against ``opentelemetry-api`` alone and a no-op unless the application configures an SDK: the
library never sets a provider. A run is instrumented only when ``opentelemetry.trace`` or
``opentelemetry.metrics`` has already been imported and a real provider is set (a ``sys.modules`` look-up
and an ``isinstance``, once per run), so without an SDK the run pays nothing at all.

Spans: one per request, ``{gen_ai.operation.name} {gen_ai.request.model}``, kind CLIENT for a server and
INTERNAL for an in-process engine (``vllm``, ``mock``), child of the caller's active span (captured where
`gather` was called, since the run executes on the shared loop's thread). Attributes ``gen_ai.provider.name``,
``gen_ai.request.*``, ``gen_ai.response.finish_reasons``, ``gen_ai.response.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens``, ``error.type`` on failure; events
``asyncbackends.attempt`` (one per attempt) and ``asyncbackends.retry`` (reason, delay, ``Retry-After``).

Metrics: ``gen_ai.client.operation.duration`` (s) and ``gen_ai.client.token.usage`` (``gen_ai.token.type``
input / output) with the conventions' bucket boundaries, and the library's own:
``asyncbackends.requests.in_flight``, ``asyncbackends.slot.wait.duration``,
``asyncbackends.rate_limit.wait.duration``, ``asyncbackends.retries`` (by ``error.type``),
``asyncbackends.cache.hits``, ``asyncbackends.replica.state`` and, for a pool with per-replica adaptive
limits, ``asyncbackends.replica.concurrency.limit``.
"""

from __future__ import annotations

import sys
import time
from typing import Any
from urllib.parse import urlsplit

from .._types import GenerationRequest, GenerationResult, LoglikelihoodRequest, Request
from .._usage import pricing_of
from ..errors import AsyncBackendsError, BackendError, RateLimitedError
from .observe import Outcome, RequestObserver, RunObserver
from .otel_instruments import DURATION_BUCKETS as DURATION_BUCKETS
from .otel_instruments import TOKEN_BUCKETS as TOKEN_BUCKETS
from .otel_instruments import instruments_of
from .run_metrics import thinking_of

__all__ = ["capture_context", "otel_observer", "record_replica_limit", "record_replica_state"]

IN_PROCESS = frozenset({"vllm", "mock"})
"""Backend names whose requests run in this process: their spans are INTERNAL, not CLIENT."""
_SCOPE = "asyncbackends"


def _version() -> str:
    from .._version import __version__

    return __version__


def capture_context() -> Any:
    """The caller's OpenTelemetry context, or ``None`` when OpenTelemetry was never imported.

    Call it in the caller's thread (in `gather` before handing the run to the shared loop).
    """
    context = sys.modules.get("opentelemetry.context")
    return None if context is None else context.get_current()


def _tracer_provider() -> Any:
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    return None if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)) else provider


def _meter_provider() -> Any:
    metrics = sys.modules.get("opentelemetry.metrics")
    if metrics is None:
        return None
    provider = metrics.get_meter_provider()
    # The API's stand-in before any provider is set is private (_ProxyMeterProvider): test by name.
    return None if type(provider).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider") else provider


def _model_of(backend: Any) -> str | None:
    fingerprint = getattr(backend, "fingerprint", None)
    if isinstance(fingerprint, dict):
        for key in ("model", "repository"):
            if isinstance(fingerprint.get(key), str):
                return str(fingerprint[key])
    model = getattr(backend, "model", None)
    return model if isinstance(model, str) else None


def _operation(request: Request) -> str:
    if isinstance(request, GenerationRequest):
        return "chat" if request.prompt_kind == "chat" else "text_completion"
    return "loglikelihood" if isinstance(request, LoglikelihoodRequest) else "loglikelihood_rolling"


def _params_attributes(request: GenerationRequest) -> dict[str, Any]:
    params = request.params
    attributes: dict[str, Any] = {
        "gen_ai.request.max_tokens": params.max_tokens,
        "gen_ai.request.temperature": params.temperature,
        "gen_ai.request.top_p": params.top_p,
    }
    if params.top_k is not None:
        attributes["gen_ai.request.top_k"] = params.top_k
    if params.seed is not None:
        attributes["gen_ai.request.seed"] = params.seed
    if params.stop:
        attributes["gen_ai.request.stop_sequences"] = list(params.stop)
    if params.n != 1:
        attributes["gen_ai.request.choice.count"] = params.n
    return attributes


class OTelObserver(RunObserver):
    """A run's spans and metrics through the configured OpenTelemetry providers."""

    __slots__ = (
        "base",
        "by_operation",
        "by_params",
        "instruments",
        "kind",
        "model",
        "parent",
        "pricing",
        "trace",
        "tracer",
    )

    def __init__(self, backend: Any, parent: Any, tracer_provider: Any, meter_provider: Any) -> None:
        provider_name = str(getattr(backend, "name", type(backend).__name__))
        self.model = _model_of(backend)
        self.pricing = pricing_of(backend)
        self.base: dict[str, Any] = {"gen_ai.provider.name": provider_name}
        if self.model is not None:
            self.base["gen_ai.request.model"] = self.model
        self.trace: Any = None
        self.tracer: Any = None
        self.kind: Any = None
        self.parent = parent
        if tracer_provider is not None:
            from opentelemetry import trace

            self.trace = trace
            self.tracer = tracer_provider.get_tracer(_SCOPE, _version())
            in_process = provider_name in IN_PROCESS
            self.kind = trace.SpanKind.INTERNAL if in_process else trace.SpanKind.CLIENT
            address = getattr(backend, "base_url", None) or getattr(backend, "url", None)
            if not in_process and isinstance(address, str):
                parts = urlsplit(address)
                if parts.hostname:
                    self.base["server.address"] = parts.hostname
                    if parts.port:
                        self.base["server.port"] = parts.port
        self.instruments = None if meter_provider is None else instruments_of(meter_provider)
        # Attribute dicts shared by requests alike: requests of one run mostly share their parameters.
        self.by_operation: dict[str, tuple[dict[str, Any], tuple[Any, ...]]] = {}
        self.by_params: dict[int, dict[str, Any]] = {}

    def metric_attributes(self, operation: str) -> tuple[dict[str, Any], tuple[Any, ...]]:
        """The attributes every metric point of ``operation`` carries (shared, never mutated), and a key."""
        found = self.by_operation.get(operation)
        if found is None:
            attributes = {**self.base, "gen_ai.operation.name": operation}
            found = self.by_operation[operation] = (attributes, tuple(sorted(attributes.items())))
        return found

    def request_started(self, index: int, request: Request, slot_wait: float) -> RequestObserver:
        """Open the request's span and count it in flight."""
        operation = _operation(request)
        common, key = self.metric_attributes(operation)
        span = None
        if self.tracer is not None:
            attributes = common
            if isinstance(request, GenerationRequest):
                params = id(request.params)  # the run's requests stay alive: an id names one params object
                attributes = self.by_params.get(params)  # type: ignore[assignment]
                if attributes is None:
                    attributes = self.by_params[params] = {**common, **_params_attributes(request)}
            name = f"{operation} {self.model}" if self.model else operation
            attributes = {**attributes, "asyncbackends.slot.wait": slot_wait}
            span = self.tracer.start_span(name, context=self.parent, kind=self.kind, attributes=attributes)
        if self.instruments is not None:
            self.instruments.in_flight.add(key, common, 1)
            self.instruments.slot_wait.record(slot_wait, common)
        return _SpanRequest(self, span, common, key, operation)

    def concurrency_changed(self, limit: int, reason: str) -> None:
        """Set the limit gauge and count the change by its reason."""
        if self.instruments is not None:
            self.instruments.concurrency_limit.set(limit, self.base)
            self.instruments.concurrency_changes.add(
                1, {**self.base, "asyncbackends.concurrency.reason": reason}
            )


class _SpanRequest(RequestObserver):
    __slots__ = (
        "attempt_t0",
        "common",
        "context",
        "key",
        "operation",
        "replica_name",
        "run",
        "span",
        "t0",
        "token",
    )

    def __init__(
        self, run: OTelObserver, span: Any, common: dict[str, Any], key: tuple[Any, ...], operation: str
    ) -> None:
        self.run, self.span, self.common, self.key, self.operation = run, span, common, key, operation
        self.t0 = time.perf_counter()
        self.attempt_t0 = 0
        self.context: Any = None
        self.token: Any = None
        self.replica_name: str | None = None

    def cache_hit(self) -> None:
        if self.span is not None:
            self.span.set_attribute("asyncbackends.cache.hit", True)
        if self.run.instruments is not None:
            self.run.instruments.cache_hits.add(self.key, self.common, 1)

    def rate_waited(self, seconds: float) -> None:
        if self.span is not None:
            self.span.set_attribute("asyncbackends.rate_limit.wait", seconds)
        if self.run.instruments is not None:
            self.run.instruments.rate_wait.record(seconds, self.common)

    def attempt_started(self, attempt: int) -> None:
        if self.span is None:
            return
        self.attempt_t0 = time.time_ns()
        if self.context is None:
            self.context = self.run.trace.set_span_in_context(self.span, self.run.parent)
        # The span is current during the attempt, so an instrumented HTTP client's spans nest under it.
        from opentelemetry import context

        self.token = context.attach(self.context)

    def attempt_ended(self, attempt: int, error: BaseException | None) -> None:
        if self.span is None:
            return
        from opentelemetry import context

        if self.token is not None:
            context.detach(self.token)
            self.token = None
        attributes: dict[str, Any] = {
            "asyncbackends.attempt": attempt,
            "asyncbackends.attempt.duration": (time.time_ns() - self.attempt_t0) / 1e9,
        }
        if error is not None:
            attributes["error.type"] = type(error).__name__
        if self.replica_name is not None:
            attributes["asyncbackends.replica"] = self.replica_name
        self.span.add_event("asyncbackends.attempt", attributes, timestamp=self.attempt_t0)

    def replica(self, name: str) -> None:
        self.replica_name = name
        if self.span is not None:
            self.span.set_attribute("asyncbackends.replica", name)

    def retrying(self, attempt: int, error: BackendError, delay: float) -> None:
        reason = type(error).__name__
        if self.span is not None:
            attributes: dict[str, Any] = {
                "asyncbackends.attempt": attempt,
                "error.type": reason,
                "asyncbackends.retry.delay": delay,
            }
            if isinstance(error, RateLimitedError) and error.retry_after is not None:
                attributes["asyncbackends.retry.retry_after"] = error.retry_after
            self.span.add_event("asyncbackends.retry", attributes)
        if self.run.instruments is not None:
            key = (*self.key, ("error.type", reason))
            self.run.instruments.retries.add(key, {**self.common, "error.type": reason}, 1)

    def done(self, outcome: Outcome) -> None:
        seconds = time.perf_counter() - self.t0
        instruments = self.run.instruments
        failed = isinstance(outcome, AsyncBackendsError)
        if instruments is not None:
            instruments.in_flight.add(self.key, self.common, -1)
            if failed:
                instruments.duration.record(seconds, {**self.common, "error.type": type(outcome).__name__})
            else:
                instruments.duration.record(seconds, self.common)
                if isinstance(outcome, GenerationResult):
                    if outcome.prompt_tokens is not None:
                        instruments.tokens.record(
                            outcome.prompt_tokens, {**self.common, "gen_ai.token.type": "input"}
                        )
                    instruments.tokens.record(
                        outcome.completion_tokens, {**self.common, "gen_ai.token.type": "output"}
                    )
        span = self.span
        if span is None:
            return
        if failed:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", type(outcome).__name__)
            span.record_exception(outcome)
            span.set_status(Status(StatusCode.ERROR, str(outcome)))
        elif isinstance(outcome, GenerationResult):
            ended: dict[str, Any] = {
                "gen_ai.response.finish_reasons": [c.finish_reason or "" for c in outcome.completions],
                "gen_ai.usage.output_tokens": outcome.completion_tokens,
            }
            thinking, cut_off = thinking_of(outcome)
            if thinking or any(c.reasoning is not None for c in outcome.completions):
                # Of the output tokens, those spent thinking (the GenAI conventions' own attribute).
                ended["gen_ai.usage.reasoning.output_tokens"] = thinking
            if cut_off:
                ended["asyncbackends.reasoning.truncated"] = cut_off
            if outcome.prompt_tokens is not None:
                ended["gen_ai.usage.input_tokens"] = outcome.prompt_tokens
            if outcome.cached_prompt_tokens is not None:
                # Of the input tokens, those read from a cache (the GenAI conventions' own attribute).
                ended["gen_ai.usage.cache_read.input_tokens"] = outcome.cached_prompt_tokens
            if self.run.pricing is not None:
                ended["asyncbackends.cost"] = self.run.pricing.cost(outcome.usage)
            if outcome.model:
                ended["gen_ai.response.model"] = outcome.model
                if self.run.model is None:
                    span.update_name(f"{self.operation} {outcome.model}")
            span.set_attributes(ended)
        span.end()

    def cancelled(self) -> None:
        """The run was cancelled (or failed elsewhere) while this request was in flight."""
        if self.token is not None:
            from opentelemetry import context

            context.detach(self.token)
            self.token = None
        if self.run.instruments is not None:
            self.run.instruments.in_flight.add(self.key, self.common, -1)
        if self.span is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.set_attribute("error.type", "CancelledError")
            self.span.set_status(Status(StatusCode.ERROR, "cancelled"))
            self.span.end()


def otel_observer(backend: Any, parent_context: Any = None) -> OTelObserver | None:
    """The run's OpenTelemetry observer, or ``None`` when no SDK provider is configured."""
    if "opentelemetry.trace" not in sys.modules and "opentelemetry.metrics" not in sys.modules:
        return None
    tracer_provider, meter_provider = _tracer_provider(), _meter_provider()
    if tracer_provider is None and meter_provider is None:
        return None
    return OTelObserver(backend, parent_context, tracer_provider, meter_provider)


def record_replica_state(pool: str, replica: str, state: str, previous: str | None = None) -> None:
    """Set the ``asyncbackends.replica.state`` gauge: 1 for ``state``, 0 for ``previous``."""
    provider = _meter_provider()
    if provider is None:
        return
    gauge = instruments_of(provider).replica_state
    attributes = {"asyncbackends.pool": pool, "asyncbackends.replica": replica}
    if previous is not None and previous != state:
        gauge.set(0, {**attributes, "asyncbackends.replica.state": previous})
    gauge.set(1, {**attributes, "asyncbackends.replica.state": state})


def record_replica_limit(pool: str, replica: str, limit: int, reason: str | None = None) -> None:
    """Set the ``asyncbackends.replica.concurrency.limit`` gauge; a move (``reason``) is counted too.

    Moves go to ``asyncbackends.concurrency.changes`` with the pool and replica among the attributes.
    """
    provider = _meter_provider()
    if provider is None:
        return
    instruments = instruments_of(provider)
    attributes = {"asyncbackends.pool": pool, "asyncbackends.replica": replica}
    instruments.replica_limit.set(limit, attributes)
    if reason is not None:
        instruments.concurrency_changes.add(1, {**attributes, "asyncbackends.concurrency.reason": reason})
