"""``asyncbackends run --metrics-port``: scraped while requests are held, parsed by Prometheus' own parser,
and scraped by a real Prometheus server where the binary is installed (Debian's ``prometheus`` package)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "opentelemetry.exporter.prometheus", reason="extra otel not installed (Prometheus exporter)"
)
from prometheus_client.parser import text_string_to_metric_families

import asyncbackends as ab
from asyncbackends._cli import main as cli

from . import gated
from .conftest import reset_globals

ROOT = Path(__file__).parents[2]
FAST = 4
HELD = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict[str, Any], sample_name: str, **labels: str) -> float:
    for family in families.values():
        for sample in family.samples:
            if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise KeyError(f"{sample_name} {labels} not in {sorted(families)}")


def _recorded(port: int) -> float:
    """The requests whose duration the run's metrics server serves (0 before the first)."""
    labels = {"gen_ai_operation_name": "text_completion", "gen_ai_request_model": "gated-model"}
    try:
        return value(scrape(port), "gen_ai_client_operation_duration_seconds_count", **labels)
    except (KeyError, OSError):  # none recorded yet, or not serving yet
        return 0.0


@pytest.fixture
def held_run(tmp_path: Path) -> Iterator[tuple[int, threading.Thread, list[int]]]:
    """The CLI running in a thread: FAST requests answered, then HELD requests waiting at the gate."""
    reset_globals()
    ab.register_backend("gated", "tests.telemetry.gated:GatedBackend", replace=True)
    gated.GATE.__init__()  # type: ignore[misc]
    lines = [{"prompt": f"fast {i}", "request_id": f"fast{i}"} for i in range(FAST)]
    lines += [{"prompt": f"held {i}", "request_id": f"held{i}"} for i in range(HELD)]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    port = free_port()
    status: list[int] = []
    argv = [
        "run", str(source), "--backend", "gated", "--output", str(tmp_path / "out.jsonl"), "--no-progress",
        "--concurrency", str(FAST), "--metrics-port", str(port), "--metrics-file", str(tmp_path / "run.jsonl"),
    ]  # fmt: skip
    thread = threading.Thread(target=lambda: status.append(cli.main(argv)), daemon=True)
    thread.start()
    try:
        assert gated.GATE.wait_for_held(HELD), "the held requests never reached the backend"
        # The last held request can reach the backend while the last fast request's worker, on the shared
        # loop's thread, is still between its answer and its record: wait for the FAST records too.
        deadline = time.monotonic() + 60  # a safety net only: the wait is for the state
        while _recorded(port) < FAST:
            assert time.monotonic() < deadline and thread.is_alive(), "the fast requests were never recorded"
            time.sleep(0.01)
        yield port, thread, status
    finally:
        gated.GATE.opened.set()
        thread.join(60)
        reset_globals()


def test_metrics_are_served_while_the_run_goes(held_run: tuple[int, threading.Thread, list[int]]) -> None:
    port, thread, status = held_run
    families = scrape(port)
    assert value(families, "asyncbackends_requests_in_flight", gen_ai_provider_name="gated") == HELD
    labels = {"gen_ai_operation_name": "text_completion", "gen_ai_request_model": "gated-model"}
    assert value(families, "gen_ai_client_operation_duration_seconds_count", **labels) == FAST
    bucket = value(families, "gen_ai_client_operation_duration_seconds_bucket", le="81.92", **labels)
    assert bucket == FAST  # the conventions' last boundary is served
    assert value(families, "gen_ai_client_token_usage_count", gen_ai_token_type="output") == FAST
    assert value(families, "gen_ai_client_token_usage_sum", gen_ai_token_type="input") == FAST * len("fast 0")
    gated.GATE.opened.set()
    thread.join(60)
    assert status == [0]
    with pytest.raises(OSError):  # the server stops with the run
        scrape(port)


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (Debian: apt-get install prometheus)")
@pytest.mark.timeout(180)
def test_a_real_prometheus_server_scrapes_the_run(
    held_run: tuple[int, threading.Thread, list[int]], tmp_path: Path
) -> None:
    port, thread, status = held_run
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        f"scrape_configs:\n  - job_name: asyncbackends\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    server = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def query(expression: str) -> list[Any]:
            url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    body = json.load(response)
            except OSError:
                return []  # not listening yet
            assert body["status"] == "success"
            return list(body["data"]["result"])

        # Wait for state: Prometheus has scraped the held run (a safety-net deadline only).
        deadline = time.monotonic() + 120
        in_flight: list[Any] = []
        while time.monotonic() < deadline and server.poll() is None:
            in_flight = query('asyncbackends_requests_in_flight{job="asyncbackends"}')
            if in_flight:
                break
            time.sleep(0.2)
        assert in_flight, "Prometheus never scraped the run"
        assert float(in_flight[0]["value"][1]) == HELD
        [up] = query('up{job="asyncbackends"}')
        assert up["value"][1] == "1"
        [count] = query('sum(gen_ai_client_operation_duration_seconds_count{job="asyncbackends"})')
        assert float(count["value"][1]) == FAST
    finally:
        server.terminate()
        server.wait(30)
    gated.GATE.opened.set()
    thread.join(60)
    assert status == [0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another socket is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_busy_port_changes_nothing_and_a_later_try_works(busy_port: int) -> None:
    from asyncbackends._observability.prometheus import MetricsServer
    from asyncbackends._observability.telemetry import _meter_provider

    reset_globals()
    try:
        with pytest.raises(ab.InvalidRequestError, match=f"cannot serve metrics on 127.0.0.1:{busy_port}: "):
            MetricsServer(busy_port)
        assert _meter_provider() is None  # nothing was installed that could not be taken back
        server = MetricsServer(0)
        try:
            assert server.port != busy_port
            assert _meter_provider() is server._provider
        finally:
            server.close()
    finally:
        reset_globals()


def test_a_busy_port_is_one_line_exit_2_and_keeps_the_output(busy_port: int, tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    output.write_text("a previous run's results\n")
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "hi"}\n')
    argv = ["run", str(source), "--backend", "mock", "--output", str(output)]
    proc = subprocess.run(
        [sys.executable, "-m", "asyncbackends", *argv, "--metrics-port", str(busy_port), "--no-progress"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"asyncbackends run: cannot serve metrics on 127.0.0.1:{busy_port}: " + (
        "Address already in use (--metrics-port 0 picks a free one)\n"
    )
    assert output.read_text() == "a previous run's results\n"
