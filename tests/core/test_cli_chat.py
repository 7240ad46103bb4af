"""The CLI's JSONL input takes content-part messages, tools and tool choice; tool calls come out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import asyncbackends as ab
from asyncbackends._cli.main import main, parse_request

TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    },
}
PNG_URL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def test_jsonl_records_take_content_parts_and_tools() -> None:
    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    request = parse_request({"prompt": [{"role": "user", "content": [image]}]})
    assert isinstance(request, ab.GenerationRequest) and request.images == (PNG_URL,)
    tooled = parse_request(
        {"prompt": [{"role": "user", "content": "x"}], "tools": [TOOL], "tool_choice": "add"}
    )
    assert isinstance(tooled, ab.GenerationRequest)
    assert tooled.tools == (ab.Tool.from_openai(TOOL),) and tooled.tool_choice == "add"


def test_run_writes_tool_calls_and_names_bad_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "in.jsonl"
    record = {
        "request_id": "t",
        "prompt": [{"role": "user", "content": "x"}],
        "tools": [TOOL],
        "tool_choice": "add",
    }
    good.write_text(json.dumps(record) + "\n")
    output = tmp_path / "out.jsonl"
    assert main(["run", str(good), "--backend", "mock", "--output", str(output)]) == 0
    (out,) = [json.loads(line) for line in output.read_text().splitlines()]
    (completion,) = out["result"]["completions"]
    assert completion["finish_reason"] == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in completion["tool_calls"]] == [("add", {"x": 0})]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({**record, "tool_choice": "sub"})
        + "\n"
        + json.dumps({"prompt": [{"role": "user", "content": [{"type": "audio"}]}]})
        + "\n"
    )
    assert main(["run", str(bad), "--backend", "mock", "--output", str(tmp_path / "o2.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:1: tool_choice" in err and f"{bad}:2: prompt[0].content[0].type" in err
    assert not (tmp_path / "o2.jsonl").exists()
