"""Reasoning models in a run's outputs and figures: the CLI's records, run metrics, spans, the report.

The mock that thinks (``thinking="split"``) thinks each prompt backwards before echoing it: with
``max_tokens=12`` a 4-character prompt thinks 4 tokens and answers, a 20-character one is cut off thinking.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._cli import main as cli
from asyncbackends._observability.report import load_run, render_report

from .conftest import OTel

SHORT, LONG = "abcd", "a prompt of twenty c"
PARAMS: dict[str, Any] = {"max_tokens": 12}


def _input(path: Path) -> None:
    lines = [{"prompt": p, "request_id": p, "params": PARAMS} for p in (SHORT, LONG, SHORT)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_cli_writes_the_thinking_beside_the_text_and_counts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out, run_file = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "run.jsonl"
    _input(source)
    status = cli.main(
        [
            "run", str(source), "--backend", "mock", "--option", "thinking=split", "--no-progress",
            "--output", str(out), "--metrics-file", str(run_file),
        ]
    )  # fmt: skip
    assert status == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    short, long = (records[i]["result"]["completions"][0] for i in (0, 1))
    assert short["text"] == SHORT and short["reasoning"] == SHORT[::-1] and short["reasoning_tokens"] == 4
    assert "reasoning_truncated" not in short  # written where set
    assert long["text"] == "" and long["reasoning_truncated"] is True
    assert long["reasoning"] == LONG[::-1][:12] and long["reasoning_tokens"] == 12
    # The run summary on standard error, and the metrics file's closing summary.
    assert "thinking: 20 tokens  cut off while thinking: 1" in capsys.readouterr().err
    data = load_run(run_file)
    assert data.end is not None
    summary = data.end["summary"]
    assert (summary["reasoning_tokens"], summary["reasoning_truncated"]) == (20, 1)
    assert sorted(r["reasoning_tokens"] for r in data.requests) == [4, 4, 12]
    html = render_report(data)
    assert "<td>of which thinking</td><td>20</td>" in html
    assert "<td>cut off while thinking (no answer)</td><td>1</td>" in html


def test_records_of_a_model_that_does_not_think_are_unchanged(tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _input(source)
    assert cli.main(["run", str(source), "--backend", "mock", "--no-progress", "--output", str(out)]) == 0
    completion = json.loads(out.read_text().splitlines()[0])["result"]["completions"][0]
    assert set(completion) == {"text", "token_ids", "logprobs", "finish_reason", "tool_calls"}
    assert "<td>of which thinking</td>" not in render_report(load_run_of(tmp_path))


def load_run_of(tmp_path: Path) -> Any:
    path = tmp_path / "plain-run.jsonl"
    backend = ab.create_backend("mock")
    from asyncbackends._observability.runlog import RunLog

    with RunLog(path, backend, 1) as run_log:
        ab.run_batch(backend, [ab.GenerationRequest(SHORT)], callbacks=run_log.callbacks)
    return load_run(path)


def test_run_metrics_and_usage_callbacks_count_thinking(make_mock: Any) -> None:
    backend = make_mock(thinking="split")
    metrics = ab.RunMetrics()
    usage: list[Any] = []
    requests = [ab.GenerationRequest(p, ab.SamplingParams(**PARAMS)) for p in (SHORT, LONG)]
    ab.run_batch(backend, requests, metrics=metrics, callbacks=ab.RunCallbacks(on_usage=usage.append))
    assert (metrics.reasoning_tokens, metrics.reasoning_truncated) == (16, 1)
    assert metrics.completion_tokens == 4 + 4 + 12  # thinking included
    assert sorted(u.reasoning_tokens for u in usage) == [4, 12]


def test_spans_carry_the_conventions_reasoning_tokens(otel: OTel, make_mock: Any) -> None:
    requests = [ab.GenerationRequest(p, ab.SamplingParams(**PARAMS)) for p in (SHORT, LONG)]
    ab.run_batch(make_mock(thinking="split", model="thinker"), requests)
    ab.run_batch(make_mock(), [ab.GenerationRequest(SHORT)])
    spans = {
        (s.attributes["gen_ai.response.model"], s.attributes["gen_ai.usage.input_tokens"]): dict(s.attributes)
        for s in otel.finished()
        if s.attributes is not None
    }
    short, long, plain = spans["thinker", 4], spans["thinker", 20], spans["mock-echo", 4]
    assert short["gen_ai.usage.reasoning.output_tokens"] == 4
    assert short["gen_ai.usage.output_tokens"] == 8
    assert "asyncbackends.reasoning.truncated" not in short
    assert long["gen_ai.usage.reasoning.output_tokens"] == 12
    assert long["asyncbackends.reasoning.truncated"] == 1
    assert "gen_ai.usage.reasoning.output_tokens" not in plain
