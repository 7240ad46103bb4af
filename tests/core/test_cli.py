from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncbackends.cli import main

EXAMPLE = Path(__file__).parents[2] / "examples" / "demo.jsonl"


def test_list_shows_builtins_and_extras(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "mock" in out and "asyncbackends.adapters.mock:MockBackend" in out and "installed" in out


def test_run_writes_one_record_per_line_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "out.jsonl"
    code = main(
        ["run", str(EXAMPLE), "--backend", "mock", "--option", "jitter=0.01", "--output", str(output)]
    )
    assert code == 0
    inputs = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(len(inputs)))
    assert [r["request_id"] for r in records] == [i["request_id"] for i in inputs]
    assert records[0]["result"]["completions"][0]["text"] == "Hello, my name i"  # max_tokens=16
    assert len(records[3]["result"]["completions"]) == 4  # n=4
    assert records[5]["result"]["logprob"] < 0
    err = capsys.readouterr().err
    assert "requests: 8" in err and "latency p50" in err


def test_run_reports_failures_as_records_and_exit_1(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    args = [
        "run",
        str(EXAMPLE),
        "--backend",
        "mock",
        "--option",
        "failure_rate=1",
        "--option",
        "failure=rejected",
    ]
    assert main([*args, "--output", str(output)]) == 1
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(records) == 8
    assert all(r["error"]["type"] == "RequestRejectedError" and not r["error"]["retryable"] for r in records)


def test_bad_lines_are_named_and_nothing_is_sent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"prompt": "fine"}\n{"prompt": ""}\nnot json\n\n{"prompt": "x", "params": {"tempreature": 1}}\n'
        '{"type": "nope"}\n["list"]\n'
    )
    output = tmp_path / "out.jsonl"
    assert main(["run", str(bad), "--backend", "mock", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: prompt must not be empty" in err
    assert f"{bad}:3: not valid JSON" in err
    assert f"{bad}:4: empty line" in err
    assert f"{bad}:5:" in err and "tempreature" in err
    assert f"{bad}:6: type must be one of" in err
    assert f"{bad}:7: expected a JSON object" in err
    assert "6 bad line(s): nothing was sent" in err
    assert not output.exists()


def test_unknown_backend_and_bad_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(EXAMPLE), "--backend", "mokc"]) == 2
    assert "did you mean 'mock'" in capsys.readouterr().err
    assert main(["run", str(EXAMPLE), "--backend", "mock", "--option", "novalue"]) == 2
    assert "key=value" in capsys.readouterr().err


def test_cache_resume_and_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "run.sqlite"
    out = tmp_path / "o.jsonl"
    args = ["run", str(EXAMPLE), "--backend", "mock", "--cache", str(cache), "--output", str(out)]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0
    # request "samples" is seeded, so all 8 are cacheable: the second run sends nothing.
    assert "cache hits: 8" in capsys.readouterr().err
    assert main(["cache", "stats", str(cache)]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 8
    assert main(["cache", "clear", str(cache)]) == 0
    assert "removed 8 entries" in capsys.readouterr().out
    assert main(["cache", "stats", str(tmp_path / "missing.sqlite")]) == 2


def test_unreachable_backend_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens on port 9 of loopback: building the openai backend (it lists models) fails.
    code = main(["run", str(EXAMPLE), "--backend", "openai", "--option", "base_url=http://127.0.0.1:9/v1"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("asyncbackends run: BackendUnavailableError: ") and "Traceback" not in err
