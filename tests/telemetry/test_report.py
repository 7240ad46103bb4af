"""``run --metrics-file`` then ``asyncbackends report``: a self-contained HTML page with the run's figures."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._cli import main as cli
from asyncbackends._observability.observe import note_replica
from asyncbackends._observability.report import load_run, render_report
from asyncbackends._observability.runlog import RunLog


def write_input(path: Path, count: int) -> None:
    path.write_text(
        "".join(json.dumps({"prompt": f"p{i}", "request_id": f"r{i}"}) + "\n" for i in range(count))
    )


def test_metrics_file_and_report_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, run_file = tmp_path / "in.jsonl", tmp_path / "run.jsonl"
    write_input(source, 40)
    status = cli.main(
        [
            "run", str(source), "--backend", "mock", "--no-progress", "--output", str(tmp_path / "out.jsonl"),
            "--option", "fail_attempts=1", "--option", "failure=rate_limited", "--option", "retry_after=0.001",
            "--max-attempts", "2", "--metrics-file", str(run_file),
        ]
    )  # fmt: skip
    assert status == 0
    data = load_run(run_file)
    assert data.header["backend"] == "mock" and data.header["requests"] == 40
    assert sorted(r["index"] for r in data.requests) == list(range(40))
    assert all(r["attempts"] == 2 and r["error"] is None for r in data.requests)
    assert len(data.retries) == 40 and {r["reason"] for r in data.retries} == {"RateLimitedError"}
    assert {r["retry_after_s"] for r in data.retries} == {0.001}
    assert data.end is not None and data.end["summary"]["successes"] == 40

    assert cli.main(["report", str(run_file)]) == 0
    report = run_file.with_suffix(".html")
    assert f"report: {report}" in capsys.readouterr().out
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert "Run report: mock · mock-echo" in html
    assert "<td>ok / failed</td><td>40 / 0</td>" in html
    assert "<td>retries</td><td>40</td>" in html
    assert html.count("<svg") == 4  # throughput, tokens per second, latency, retries (no errors: "none")
    assert ">RateLimitedError</text>" in html
    # Self-contained: no script, no stylesheet or image fetched, no link anywhere but the SVG namespace.
    assert "<script" not in html.lower()
    assert not re.search(r"\b(src|href)=", html)
    assert set(re.findall(r"https?://[^\"' ]+", html)) == {"http://www.w3.org/2000/svg"}


def test_report_shows_errors_and_replicas(tmp_path: Path) -> None:
    class TwoReplicas(ab.BaseBackend):
        name = "pool"
        capabilities = ab.Capabilities()

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            index = int(str(request.request_id))
            note_replica("http://b:8080" if index % 3 == 0 else "http://a:8080")
            if index % 3 == 0:
                raise ab.BackendUnavailableError("b is down", retryable=False)
            return ab.GenerationResult(request.request_id, (ab.Completion("ok", (1, 2)),), 3)

    requests = [ab.GenerationRequest("x", request_id=str(i)) for i in range(9)]
    path = tmp_path / "run.jsonl"
    backend = TwoReplicas()
    with RunLog(path, backend, len(requests)) as run_log:
        ab.run_batch(backend, requests, callbacks=run_log.callbacks, return_exceptions=True)
    html = render_report(load_run(path))
    assert "<td>ok / failed</td><td>6 / 3</td>" in html
    assert ">BackendUnavailableError</text>" in html
    assert "<h2>Per replica</h2>" in html
    assert "<tr><td>http://a:8080</td><td>6</td><td>0</td>" in html
    assert "<tr><td>http://b:8080</td><td>3</td><td>3</td>" in html


def test_a_file_that_is_not_a_metrics_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "not a metrics file"}\n')
    assert cli.main(["report", str(bad)]) == 2
    assert "not a metrics-file line" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "missing.jsonl")]) == 2


def test_an_unfinished_run_is_reported_as_such(tmp_path: Path, mock: Any) -> None:
    path = tmp_path / "run.jsonl"
    run_log = RunLog(path, mock, 5)
    ab.run_batch(mock, [ab.GenerationRequest("a")], callbacks=run_log.callbacks)
    run_log._file.flush()  # the process died here: no end line
    html = render_report(load_run(path))
    assert "(the run did not finish)" in html and "1 finished of 5" in html
    run_log.close()
