"""`MetricsServer`: a run's OpenTelemetry metrics served in Prometheus' text format over HTTP.

What ``asyncbackends run ... --metrics-port PORT`` starts. The command line is an application, so unlike the
library it may configure OpenTelemetry: it sets a global meter provider whose only reader is
OpenTelemetry's Prometheus exporter, registered in a registry of its own and served by
``prometheus_client``'s HTTP server on a daemon thread. Names follow OpenTelemetry's Prometheus
compatibility rules: ``gen_ai.client.operation.duration`` (unit s) is served as
``gen_ai_client_operation_duration_seconds``.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequestError

__all__ = ["MetricsServer"]

_HINT = "pip install 'asyncbackends[otel]'"


class MetricsServer:
    """Serve the process's OpenTelemetry metrics at ``http://HOST:PORT/metrics`` until `close`.

    Args:
        port: TCP port; 0 picks a free one (read it back from ``port``).
        host: Address to bind; loopback unless Prometheus scrapes from another machine.

    Raises:
        InvalidRequestError: The OpenTelemetry SDK or its Prometheus exporter is not installed, or the process
            already has a meter provider (then export through that one instead).
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        try:
            from opentelemetry import metrics
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.resources import Resource
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as exc:
            raise InvalidRequestError(f"--metrics-port needs {exc.name}: {_HINT}") from exc
        from .telemetry import _meter_provider

        if _meter_provider() is not None:
            raise InvalidRequestError(
                "an OpenTelemetry meter provider is already configured in this process; "
                "add a Prometheus reader to it instead of --metrics-port"
            )
        self.registry = CollectorRegistry()
        self._reader = PrometheusMetricReader(registry=self.registry)
        resource = Resource.create({"service.name": "asyncbackends"})
        self._provider: Any = MeterProvider(metric_readers=[self._reader], resource=resource)
        metrics.set_meter_provider(self._provider)
        self._server, self._thread = start_http_server(port, host, registry=self.registry)
        self.host = host
        self.port: int = self._server.server_port
        """The port actually bound."""

    @property
    def url(self) -> str:
        """Where the metrics are served."""
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and shut the meter provider down."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        self._provider.shutdown()
