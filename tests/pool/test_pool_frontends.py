"""A pool where users meet it: the CLI's --replicas file, lm-eval's model args, lighteval's config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncbackends._cli.main import main


def replicas_file(tmp_path: Path, count: int = 2, **top: Any) -> Path:
    lines = [f"{key} = {json.dumps(value)}" for key, value in top.items()]
    for i in range(count):
        lines += ["[[replicas]]", 'backend = "mock"', f"latency = {0.001 * (i + 1)}", f'label = "m{i}"']
    path = tmp_path / "replicas.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_run_with_a_replicas_file_reports_each_replica(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(
        "".join(json.dumps({"prompt": f"hello {i}", "request_id": str(i)}) + "\n" for i in range(40))
    )
    output = tmp_path / "out.jsonl"
    file = str(replicas_file(tmp_path))
    args = [
        "run",
        str(inputs),
        "--backend",
        "pool",
        "--replicas",
        file,
        "--output",
        str(output),
        "--no-progress",
    ]
    code = main(args)
    assert code == 0
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["request_id"] for r in records] == [str(i) for i in range(40)]
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("replica ")]
    assert [line.split(":")[0] for line in lines] == ["replica m0", "replica m1"]
    counts = [int(line.split("requests: ")[1].split()[0]) for line in lines]
    assert sum(counts) == 40 and all(c > 0 for c in counts)


def test_cli_replicas_with_another_backend_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(json.dumps({"prompt": "hi"}) + "\n")
    code = main(["run", str(inputs), "--backend", "mock", "--replicas", str(replicas_file(tmp_path))])
    assert code == 2
    assert "replicas" in capsys.readouterr().err
