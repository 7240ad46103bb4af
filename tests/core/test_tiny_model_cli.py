"""``python -m asyncbackends.testing.tiny_model``: every kind of tiny model, a chosen folder, ``--help``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncbackends.testing.tiny_model import build_tiny_reasoning_model, build_tiny_vlm

ROOT = Path(__file__).parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _tiny_model(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "asyncbackends.testing.tiny_model", *args]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=110)


@pytest.mark.parametrize(
    ("kind", "build"), [("reasoning", build_tiny_reasoning_model), ("vlm", build_tiny_vlm)]
)
def test_kind_builds_that_model_and_prints_only_its_path(kind: str, build: Callable[[], Path]) -> None:
    done = _tiny_model("--kind", kind)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"{build()}\n"


def test_a_path_argument_builds_the_plain_model_there(tmp_path: Path) -> None:
    target = tmp_path / "tiny"
    done = _tiny_model(str(target))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"{target}\n"
    assert json.loads((target / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_help_names_the_kinds() -> None:
    done = _tiny_model("--help")
    assert done.returncode == 0
    assert "--kind {plain,reasoning,vlm}" in done.stdout and "PATH" in done.stdout.upper()
