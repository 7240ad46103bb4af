"""The CLI's --price, --budget-tokens and --budget-cost: refused, stopped and resumed as the library does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncbackends._cli import main as cli

PROMPTS = [f"question {i:03d}" for i in range(30)]  # 12 characters: 12 tokens in, 12 out on the mock


def _input(path: Path) -> None:
    lines = [{"prompt": p, "request_id": p, "params": {"max_tokens": 12}} for p in PROMPTS]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_budget_stops_the_cli_run_and_a_rerun_with_a_larger_one_finishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out, cache = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "run.sqlite"
    _input(source)
    base = [
        "run",
        str(source),
        "--backend",
        "mock",
        "--no-progress",
        "--output",
        str(out),
        "--cache",
        str(cache),
    ]
    # 24 tokens a request at 1.0 in and 2.0 out per 1M: 12e-6 + 24e-6 = 36e-6 each; 10 requests fit 3.6e-4.
    priced = [*base, "--price", "input=1.0", "--price", "output=2.0", "--concurrency", "4"]
    assert cli.main([*priced, "--budget-cost", "0.00036"]) == 1  # some requests were not sent
    records = [json.loads(line) for line in out.read_text().splitlines()]
    done = [r for r in records if "result" in r]
    refused = [r for r in records if "error" in r]
    assert len(done) == 10 and len(refused) == 20
    assert {r["error"]["type"] for r in refused} == {"BudgetExceededError"}
    assert not any(r["error"]["retryable"] for r in refused)
    summary = capsys.readouterr().err
    assert "cost: 0.0004" in summary and "BudgetExceededError: 20" in summary
    # The rerun reads the ten from the cache and sends the twenty.
    assert cli.main([*priced, "--budget-tokens", "100000"]) == 0
    err = capsys.readouterr().err
    assert "cache hits: 10" in err and "cost: 0.0011" in err  # 30 * 36e-6 = 1.08e-3, the whole run's


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget-cost", "1"], "--budget-cost needs the backend's prices"),
        (["--price", "input=1"], "--price: output must be given"),
        (["--price", "input=1", "--price", "output=1", "--price", "cache=1"], "unknown field 'cache'"),
        (["--budget-tokens", "-5"], "Budget.tokens must be an int >= 0"),
    ],
)
def test_bad_prices_and_budgets_are_one_line_exit_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _input(source)
    assert (
        cli.main(["run", str(source), "--backend", "mock", "--no-progress", "--output", str(out), *extra])
        == 2
    )
    assert message in capsys.readouterr().err
    assert not out.exists()
