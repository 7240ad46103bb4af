"""inspect_ai's own `eval` through the provider on a real vLLM engine: outputs equal vLLM's offline `LLM.chat`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.solver import generate, system_message

from asyncbackends.integrations.inspect_ai import inspect_model

from .inspect_offline import offline_chat_reference

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    # vLLM's engine shutdown leaves a ZMQ context for the garbage collector; inspect leaves anyio streams.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning"),
]

SYSTEM = "You answer briefly."
QUESTIONS = ["What is two plus two?", "Name a colour.", "Once upon a time", "def add(a, b):", "Count: 1 2 3"]
MAX_TOKENS = 12
# The session engine's settings (conftest.py), so the reference renders and decodes the same way.
ENGINE = {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.1, "max_model_len": 512}


@pytest.fixture(scope="session")
def offline_chat(
    tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """vLLM's offline ``LLM.chat`` in a subprocess, started before the session's engine so both start-ups
    overlap (session scope, listed first by the test); calling the fixture's value waits for its rows."""
    work = tmp_path_factory.mktemp("inspect_offline_chat")
    conversations = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS
    ]
    with offline_chat_reference(str(tiny_model_path), ENGINE, conversations, MAX_TOKENS, work) as rows:
        yield rows


def eval_questions(model: Any, tmp_path: Path) -> list[Any]:
    """inspect's ``eval`` of `QUESTIONS` after `SYSTEM`, greedy, `MAX_TOKENS`: the samples, in `QUESTIONS` order."""
    task = Task(
        dataset=[Sample(input=q, target="x") for q in QUESTIONS],
        solver=[system_message(SYSTEM), generate()],
    )
    logs = eval(
        task,
        model=model,
        log_dir=str(tmp_path / "logs"),
        display="none",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert logs[0].status == "success", logs[0].error
    return sorted(logs[0].samples or [], key=lambda s: QUESTIONS.index(str(s.input)))


def test_inspect_eval_on_vllm_equals_offline_llm_chat(
    offline_chat: Callable[[], list[dict[str, Any]]], vllm_backend: Any, tmp_path: Path
) -> None:
    expected = offline_chat()
    samples = eval_questions(inspect_model(vllm_backend), tmp_path)
    assert len(samples) == len(QUESTIONS)
    for sample, reference in zip(samples, expected, strict=True):
        assert sample.output.completion == reference["text"], sample.input
        usage = sample.output.usage
        assert usage is not None
        assert (usage.input_tokens, usage.output_tokens) == (
            reference["prompt_tokens"],
            reference["output_tokens"],
        )
