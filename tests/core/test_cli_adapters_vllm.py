"""``asyncbackends run --backend vllm --option lora_modules=...`` with lines naming their adapters, for real.

The command runs in a process of its own (the command line as a user types it, ``lora_modules`` as text);
meanwhile this process builds the reference, the ``vllm`` backend with the same adapters called from Python,
so the two engine starts overlap. Every record equals the Python API's result for its line (greedy texts
and token ids, loglikelihoods to 1e-4), and the adapters' answers differ from the base's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import asyncbackends as ab
from asyncbackends._cli.main import parse_request
from asyncbackends.testing.tiny_model import build_tiny_lora, build_tiny_model
from tests.lora_testing import ENGINE_MARKS
from tests.processes import start_group, stop_group
from tests.tiny_engine import ENGINE_OPTIONS, build_backend

pytestmark = [*ENGINE_MARKS, pytest.mark.timeout(900)]

ROOT = Path(__file__).parents[2]
PROMPTS = ["The quick brown fox", "Paris is the capital of"]


def _lines() -> list[dict[str, object]]:
    lines: list[dict[str, object]] = []
    for adapter in ("alpha", "beta", None):
        for prompt in PROMPTS:
            line: dict[str, object] = {"prompt": prompt, "params": {"max_tokens": 10}}
            lines.append(line if adapter is None else {**line, "adapter": adapter})
        pair: dict[str, object] = {
            "type": "loglikelihood",
            "context": "Paris is the capital of",
            "continuation": " France",
        }
        lines.append(pair if adapter is None else {**pair, "adapter": adapter})
    return lines


def test_lines_naming_adapters_equal_the_python_api_and_differ_from_the_base(tmp_path: Path) -> None:
    base = str(build_tiny_model())
    adapters = {
        name: str(build_tiny_lora(base, rank=8, seed=seed)) for name, seed in (("alpha", 1), ("beta", 2))
    }
    lines = _lines()
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    options = [
        f"--option=model={base}",
        "--option=lora_modules=" + "|".join(f"{k}={v}" for k, v in adapters.items()),
    ]
    options += [f"--option={key}={json.dumps(value)}" for key, value in ENGINE_OPTIONS.items()]
    command = [sys.executable, "-m", "asyncbackends", "run", str(source), "--backend", "vllm", *options]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = (tmp_path / "stderr.txt").open("wb")
    proc = start_group([*command, "--output", str(out), "--no-progress"], stderr=log, env=env, cwd=ROOT)
    try:
        reference = build_backend(base, lora_modules=adapters)
        try:
            want = ab.run_batch(reference, [parse_request(line) for line in lines])
        finally:
            reference.close()
        assert proc.wait(timeout=600) == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
    finally:
        stop_group(proc)
        log.close()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r.get("adapter") for r in records] == [line.get("adapter") for line in lines]
    for record, result, line in zip(records, want, lines, strict=True):
        if isinstance(result, ab.GenerationResult):
            (completion,) = record["result"]["completions"]
            assert completion["text"] == result.text, line
            assert completion["token_ids"] == list(result.completions[0].token_ids), line
        else:
            assert isinstance(result, ab.LoglikelihoodResult)
            assert record["result"]["logprob"] == pytest.approx(result.logprob, abs=1e-4), line
    # Per adapter: two generations and a score, each unlike the base's (the last three lines).
    by_adapter = [records[i : i + 3] for i in range(0, 9, 3)]
    answers = [[json.dumps(r["result"], sort_keys=True) for r in group] for group in by_adapter]
    for group in answers[:2]:
        assert all(a != b for a, b in zip(group, answers[2], strict=True))
    assert answers[0] != answers[1]
