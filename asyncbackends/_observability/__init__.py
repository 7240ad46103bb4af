"""Run observers, OpenTelemetry, callbacks, run metrics, the report and the Prometheus server (private)."""
