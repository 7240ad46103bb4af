"""``asyncbackends run`` with LoRA adapters: ``--adapter``, a line's own ``adapter``, ``lora_modules`` as text.

On the mock (its adapters echo ``[name] ``) and on a mock that takes ``lora_modules`` as the ``vllm``
backend does (tests/lora_testing.py); the real engine in test_cli_adapters_vllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._cli.main import main, parse_request
from tests.lora_testing import NAME as LORA_MOCK


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


LINES = [
    {"prompt": "hello", "request_id": "base"},
    {"prompt": "hello", "adapter": "math", "request_id": "math"},
    {"type": "loglikelihood", "context": "2+2=", "continuation": "4", "adapter": "code"},
    {"type": "loglikelihood_rolling", "text": "some text", "adapter": "math"},
]


def test_each_line_names_its_own_adapter_and_the_record_keeps_it(tmp_path: Path) -> None:
    source = _write(tmp_path / "in.jsonl", LINES)
    out = tmp_path / "out.jsonl"
    argv = ["run", str(source), "--backend", "mock", "--option", "adapters=math,code", "--output", str(out)]
    assert main(argv) == 0
    records = _records(out)
    assert [r.get("adapter") for r in records] == [None, "math", "code", "math"]
    assert "adapter" not in records[0]  # the base model's record is as records always were
    texts = [r["result"]["completions"][0]["text"] for r in records[:2]]
    assert texts == ["hello", "[math] hello"]
    mock = ab.create_backend("mock", adapters=("math", "code"))
    want = ab.run_batch(mock, [parse_request(line) for line in LINES[2:]])
    assert [r["result"]["logprob"] for r in records[2:]] == [w.logprob for w in want]  # type: ignore[union-attr]


def test_adapter_flag_names_it_on_every_line_and_a_line_naming_another_fails_alone(
    tmp_path: Path,
) -> None:
    source = _write(tmp_path / "in.jsonl", LINES)
    out = tmp_path / "out.jsonl"
    argv = ["run", str(source), "--backend", "mock", "--option", "adapters=math,code"]
    assert main([*argv, "--adapter", "math", "--output", str(out)]) == 1
    records = _records(out)
    assert [r["adapter"] for r in records] == ["math", "math", "code", "math"]
    assert [r["result"]["completions"][0]["text"] for r in records[:2]] == ["[math] hello"] * 2
    error = records[2]["error"]
    assert error["type"] == "InvalidRequestError" and not error["retryable"]
    assert "'code'" in error["message"] and "'math'" in error["message"]
    assert "result" in records[3]


def test_lora_modules_from_the_command_line_as_pairs_or_json(tmp_path: Path) -> None:
    source = _write(tmp_path / "in.jsonl", [{"prompt": "hi", "adapter": "code"}])
    for spelling in ("math=/ckpt/math|code=/ckpt/code", '{"math": "/ckpt/math", "code": "/ckpt/code"}'):
        out = tmp_path / "out.jsonl"
        argv = ["run", str(source), "--backend", LORA_MOCK, "--option", f"lora_modules={spelling}"]
        assert main([*argv, "--output", str(out)]) == 0
        (record,) = _records(out)
        assert record["adapter"] == "code" and record["result"]["completions"][0]["text"] == "[code] hi"


def test_the_adapter_flag_reaches_the_cache_key(tmp_path: Path) -> None:
    source = _write(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    cache = tmp_path / "run.sqlite"
    argv = ["run", str(source), "--backend", "mock", "--option", "adapters=math,code", "--cache", str(cache)]
    texts = []
    for adapter in ("math", "code", None):
        out = tmp_path / f"{adapter}.jsonl"
        extra = ["--adapter", adapter] if adapter else []
        assert main([*argv, *extra, "--output", str(out)]) == 0
        texts.append(_records(out)[0]["result"]["completions"][0]["text"])
    assert texts == ["[math] hi", "[code] hi", "hi"]  # never one adapter's answer for another's


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "mock", "--adapter", "math"], "serves no LoRA adapters"),
        (["--backend", "mock", "--adapter", " math"], "adapter must be a non-empty name"),
        (["--backend", LORA_MOCK, "--option", "lora_modules=math=|b=/x"], "'math' has no path"),
        (["--backend", LORA_MOCK, "--option", "lora_modules=a=/x|a=/y"], "'a' is given twice"),
        (["--backend", LORA_MOCK, "--option", "lora_modules=[1]"], "expected name=path pairs"),
    ],
)
def test_adapter_mistakes_are_one_line_exit_2_and_keep_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    source = _write(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    assert main(["run", str(source), *argv, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert out.read_text() == "previous\n"


def test_a_line_whose_adapter_is_not_a_name_is_a_bad_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _write(tmp_path / "in.jsonl", [{"prompt": "hi", "adapter": ""}, {"prompt": "hi", "adapter": 3}])
    assert main(["run", str(source), "--backend", "mock", "--option", "adapters=math"]) == 2
    err = capsys.readouterr().err
    assert f"{source}:1: adapter must be a non-empty name" in err
    assert f"{source}:2: adapter must be a str or None" in err
