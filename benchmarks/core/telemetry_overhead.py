"""Observability overhead: `run_batch` to an instant backend with and without instrumentation.

Modes (each in a fresh process, rounds interleaved, median reported):
- ``off``: nothing observes; OpenTelemetry never imported (the reference).
- ``api_only``: the OpenTelemetry API imported but no SDK provider set (a library's usual situation).
- ``sdk``: the SDK configured and exporting: a `TracerProvider` with a `BatchSpanProcessor` feeding an
  exporter that counts spans, and a `MeterProvider` with a periodic reader feeding an exporter that drops
  them (in-process, so the figure is the instrumentation's cost, not a network's).
- ``sdk_metrics``: metrics only (what ``--metrics-port`` configures: OpenTelemetry's Prometheus reader).
- ``callbacks``: `RunCallbacks` with all three callbacks set to a function that does nothing.
- ``sdk_floor``: no run at all: the SDK configured as in ``sdk``, and for each request only the OpenTelemetry
  calls the run's observer makes for one successful request (a span with its attributes, the context made
  current for the attempt, one attempt event, the result's attributes, four histogram points), in a plain
  loop. What the SDK itself costs per request, whoever calls it.

Wall time and the process's CPU time are both reported: on a shared, loaded machine CPU time is the
steadier measure of what the instrumentation costs. Usage: ``python benchmarks/core/telemetry_overhead.py
[--n 100000] [--rounds 3] [--latency 0] [--modes off,sdk]``. With ``--latency S`` each request sleeps S
seconds (concurrency 64), a backend closer to a real server. ``--one off`` run with another tree first on
``PYTHONPATH`` measures that tree (before/after a change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any

MODES = ("off", "api_only", "sdk", "sdk_metrics", "callbacks", "sdk_floor")


def configure(mode: str) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if mode == "api_only":
        import opentelemetry.metrics
        import opentelemetry.trace  # noqa: F401
    if mode in ("sdk", "sdk_metrics"):
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider

        if mode == "sdk":
            from opentelemetry.sdk.metrics.export import (
                MetricExporter,
                MetricExportResult,
                PeriodicExportingMetricReader,
            )

            class DropMetrics(MetricExporter):
                def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
                    return MetricExportResult.SUCCESS

                def force_flush(self, timeout_millis: float = 10_000) -> bool:
                    return True

                def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
                    pass

            reader: Any = PeriodicExportingMetricReader(DropMetrics(), export_interval_millis=1000)
        else:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry

            reader = PrometheusMetricReader(registry=CollectorRegistry())
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    if mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class CountSpans(SpanExporter):
            count = 0

            def export(self, spans: Any) -> Any:
                CountSpans.count += len(spans)
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(CountSpans(), max_queue_size=200_000))
        trace.set_tracer_provider(provider)
        state["provider"], state["exporter"] = provider, CountSpans
    return state


def sdk_floor(n: int) -> dict[str, float]:
    """The SDK's own work for ``n`` successful requests, as the run's observer asks for it, without a run."""
    state = configure("sdk")
    from opentelemetry import context, metrics, trace

    from asyncbackends._observability.otel_instruments import instruments_of

    tracer = trace.get_tracer("asyncbackends")
    instruments = instruments_of(metrics.get_meter_provider())
    common = {"gen_ai.provider.name": "instant", "gen_ai.operation.name": "text_completion"}
    span_attributes = {
        **common,
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.temperature": 0.0,
        "gen_ai.request.top_p": 1.0,
        "asyncbackends.slot.wait": 0.001,
    }
    kind = trace.SpanKind.INTERNAL
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        span = tracer.start_span("text_completion", kind=kind, attributes=span_attributes)
        instruments.slot_wait.record(0.001, common)
        token = context.attach(trace.set_span_in_context(span))
        context.detach(token)
        span.add_event(
            "asyncbackends.attempt", {"asyncbackends.attempt": 1, "asyncbackends.attempt.duration": 0.0}
        )
        instruments.duration.record(0.001, common)
        instruments.tokens.record(1, {**common, "gen_ai.token.type": "input"})
        instruments.tokens.record(1, {**common, "gen_ai.token.type": "output"})
        span.set_attributes(
            {
                "gen_ai.response.finish_reasons": ["stop"],
                "gen_ai.usage.output_tokens": 1,
                "gen_ai.usage.input_tokens": 1,
            }
        )
        span.end()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    state["provider"].force_flush()
    assert state["exporter"].count == n, state["exporter"].count
    return {"seconds": elapsed, "cpu_seconds": cpu}


def one(mode: str, n: int, latency: float) -> dict[str, float]:
    if mode == "sdk_floor":
        return sdk_floor(n)
    import asyncbackends as ab

    state = configure(mode)

    class Instant(ab.BaseBackend):
        name = "instant"
        capabilities = ab.Capabilities()

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            await asyncio.sleep(latency)
            return ab.GenerationResult(request.request_id, (ab.Completion("ok", (1,), None, "stop"),), 1)

    def nothing(_: object) -> None:
        pass

    callbacks = ab.RunCallbacks(nothing, nothing, nothing) if mode == "callbacks" else None
    requests = [ab.GenerationRequest("x") for _ in range(n)]
    manager = ab.get_loop_manager()
    manager.run(asyncio.sleep(0))
    # Passed only when set, so mode "off" also runs against a tree without the option (before/after).
    extra: dict[str, Any] = {} if callbacks is None else {"callbacks": callbacks}
    start, cpu = time.perf_counter(), time.process_time()
    results = ab.run_batch(
        Instant(), requests, concurrency=64, retry=ab.RetryPolicy(max_attempts=3), timeout=30.0, **extra
    )
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert len(results) == n
    if mode == "sdk":
        state["provider"].force_flush()
        assert state["exporter"].count == n, state["exporter"].count  # every span was exported
    if mode == "api_only":
        assert "opentelemetry.sdk" not in sys.modules
    if mode == "off":
        assert not any(m.startswith("opentelemetry") for m in sys.modules)
    return {"seconds": elapsed, "cpu_seconds": cpu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--one", choices=MODES)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.n, args.latency)))
        return
    modes = args.modes.split(",")
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:  # interleaved: noise on a shared machine hits every mode alike
            command = [
                sys.executable,
                __file__,
                "--one",
                mode,
                "--n",
                str(args.n),
                "--latency",
                str(args.latency),
            ]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    print(f"{args.n} requests, latency {args.latency} s, median of {args.rounds} interleaved rounds\n")
    print(f"| mode | wall us/request | wall vs {modes[0]} | CPU us/request | CPU vs {modes[0]} |")
    print("|---|---|---|---|---|")
    for mode in modes:
        wall, cpu = median(mode, "seconds"), median(mode, "cpu_seconds")
        wall_ratio, cpu_ratio = wall / median(modes[0], "seconds"), cpu / median(modes[0], "cpu_seconds")
        per_request = f"{wall / args.n * 1e6:.1f} | {wall_ratio:.2f}x | {cpu / args.n * 1e6:.1f}"
        print(f"| {mode} | {per_request} | {cpu_ratio:.2f}x |")
    print("\nEvery process (wall / CPU us per request, in round order):\n")
    for mode in modes:
        figures = ", ".join(
            f"{r['seconds'] / args.n * 1e6:.1f} / {r['cpu_seconds'] / args.n * 1e6:.1f}" for r in runs[mode]
        )
        print(f"- {mode}: {figures}")


if __name__ == "__main__":
    main()
