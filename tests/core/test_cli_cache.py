"""``asyncbackends cache export|prune``: the cache's own export and prune from the command line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from asyncbackends._cli.main import main

EXAMPLE = Path(__file__).parents[2] / "examples" / "demo.jsonl"


@pytest.fixture
def cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "run.sqlite"
    out = tmp_path / "o.jsonl"
    assert main(["run", str(EXAMPLE), "--backend", "mock", "--cache", str(path), "--output", str(out)]) == 0
    capsys.readouterr()
    return path


def test_export_writes_the_entries_to_stdout_or_a_file(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", "export", str(cache)]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert len(lines) == 8 and {line["backend"] for line in lines} == {"mock"}
    assert "exported 8 entries" in captured.err  # the count on stderr: stdout holds only the data
    target = tmp_path / "entries.jsonl"
    assert main(["cache", "export", str(cache), "--output", str(target), "--backend", "nobody"]) == 0
    assert target.read_text() == "" and "exported 0 entries" in capsys.readouterr().err


def test_prune_by_age_and_backend(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with sqlite3.connect(cache) as db:
        db.execute("UPDATE results SET created = julianday('now') - 40 WHERE rowid IN (1, 2, 3)")
    assert main(["cache", "prune", str(cache), "--older-than", "30"]) == 0
    assert "removed 3 entries" in capsys.readouterr().out
    assert main(["cache", "prune", str(cache), "--backend", "mock"]) == 0
    assert "removed 5 entries" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["prune"], "needs older_than_days or backend"),
        (["prune", "--older-than", "-1"], ">= 0"),
        (["stats", "--older-than", "3"], "--older-than is a prune option"),
        (["clear", "--backend", "mock"], "--backend is an export and prune option"),
        (["prune", "--backend", "mock", "--output", "x"], "--output is an export option"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(
    cache: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", args[0], str(cache), *args[1:]]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert main(["cache", "stats", str(cache)]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 8  # nothing was deleted
