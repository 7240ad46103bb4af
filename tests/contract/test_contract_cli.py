"""`asyncbackends contract NAME`: the installed console command, end to end, in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
COMMAND = str(Path(sys.executable).with_name("asyncbackends"))


def _contract(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [COMMAND, "contract", *args],
        cwd=tmp_path,  # away from the project's pytest settings
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )


def test_cli_passes_the_third_party_adapter_found_by_entry_point(tmp_path: Path) -> None:
    done = _contract(tmp_path, "reverse-echo", "--option", "api_key=sk-cli-test", "--", "-q")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "asyncbackends contract 'reverse-echo': no contract broken" in done.stdout


def test_cli_exits_non_zero_naming_the_broken_contract(tmp_path: Path) -> None:
    done = _contract(tmp_path, "broken_adapters:StopIgnoredBackend", "--", "-q")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "BROKEN test_stop" in done.stdout


def test_cli_imports_an_adapter_from_the_working_folder(tmp_path: Path) -> None:
    # What a new user does: write my_adapters.py, then check it from that folder with the console script.
    (tmp_path / "my_adapters.py").write_text(
        "from asyncbackends.adapters.mock import MockBackend\n\n\nclass UpperEcho(MockBackend):\n    pass\n"
    )
    done = _contract(tmp_path, "my_adapters:UpperEcho", "--", "-q", "-k", "test_generate_returns")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "asyncbackends contract 'my_adapters:UpperEcho': no contract broken" in done.stdout


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no-such-adapter", "no backend named 'no-such-adapter'"),
        ("no_such_module:Backend", "backend 'no_such_module:Backend': cannot import 'no_such_module': "),
        ("broken_adapters:NoSuchClass", "backend 'broken_adapters:NoSuchClass': 'broken_adapters' has no "),
    ],
)
def test_cli_an_adapter_that_cannot_be_loaded_is_one_line_and_exit_2(
    tmp_path: Path, name: str, message: str
) -> None:
    done = _contract(tmp_path, name, "--", "-q")
    assert done.returncode == 2, done.stdout[-3000:]
    assert done.stdout == ""
    assert done.stderr.startswith(f"asyncbackends contract: {message}"), done.stderr
    assert done.stderr.count("\n") == 1


def test_cli_pytest_usage_error_is_no_verdict(tmp_path: Path) -> None:
    done = _contract(tmp_path, "mock", "--", "--no-such-pytest-flag")
    assert done.returncode == 4  # pytest's usage error
    assert "no contract test ran" in done.stdout


def test_cli_reports_a_server_that_cannot_be_reached(tmp_path: Path) -> None:
    done = _contract(
        tmp_path, "tgi", "--option", "url=http://127.0.0.1:9", "--option", "token=false", "--", "-q"
    )
    assert done.returncode == 3, done.stdout[-3000:]
    assert "cannot reach the server of backend 'tgi'" in done.stdout
    assert "BROKEN" not in done.stdout
