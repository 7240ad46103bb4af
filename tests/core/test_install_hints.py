"""A TGI-only install: what needs the `testing` extra says so with the pip command, not a 500 or a traceback."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncbackends._cli import main as cli

ROOT = Path(__file__).parents[2]


def test_contract_without_pytest_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "pytest" else real(name, *args)

    monkeypatch.setattr(cli.importlib.util, "find_spec", find_spec)
    assert cli.main(["contract", "mock"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "asyncbackends contract: the contract suite runs on pytest: pip install 'asyncbackends[testing]'\n"
    )


def test_fake_tgi_without_jsonschema_names_the_extra() -> None:
    code = "import sys; sys.modules['jsonschema'] = None; import asyncbackends.testing.fake_tgi"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "ModuleNotFoundError: the look-alike TGI server checks requests against TGI's OpenAPI schema and "
        "needs jsonschema: pip install 'asyncbackends[testing]'"
    )
