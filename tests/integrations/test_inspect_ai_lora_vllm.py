"""inspect_ai's ``eval`` on ``asyncbackends/vllm/<base>:<adapter dir>``: equal to vLLM's offline ``LLM.chat``
with that ``LoRARequest``, and unlike the base model served by the same engine.

The offline reference runs in a subprocess started first, so its engine start overlaps ours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..lora_testing import ENGINE_MARKS, tiny_base_and_lora

pytest.importorskip("inspect_ai")
from inspect_ai.model import Model, get_model

from .inspect_offline import offline_chat_reference
from .test_inspect_ai_vllm import ENGINE, MAX_TOKENS, QUESTIONS, SYSTEM, eval_questions

pytestmark = [
    *ENGINE_MARKS,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning"),
]


@pytest.fixture(scope="module")
def base_and_lora() -> tuple[str, str]:
    return tiny_base_and_lora()


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
    options = {**ENGINE, "enable_lora": True, "max_lora_rank": 8, "max_loras": 1}
    with offline_chat_reference(base, options, conversations, MAX_TOKENS, work, lora=lora) as rows:
        yield rows


def _answers(model: Model, tmp_path: Path) -> list[str]:
    return [sample.output.completion for sample in eval_questions(model, tmp_path)]


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
