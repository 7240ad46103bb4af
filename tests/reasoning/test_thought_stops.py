"""`ThoughtStops` on vLLM's own ``deepseek_r1`` parser and the tiny reasoning model's tokenizer, no engine:
where a stop string ends the answer, whatever the number of tokens each streamed output adds."""

from __future__ import annotations

import importlib.util
import types
from typing import Any

import pytest

from asyncbackends.testing.tiny_model import build_tiny_reasoning_model

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
    pytest.mark.slow,  # imports vLLM
]
STOPS = ["\n\n", "Question:"]


@pytest.fixture(scope="module")
def setup() -> tuple[Any, Any, list[int]]:
    from vllm.tokenizers import get_tokenizer

    from asyncbackends.adapters.vllm._reasoning import ReasoningPath

    model = str(build_tiny_reasoning_model())
    tokenizer = get_tokenizer(model)
    # What ReasoningPath reads of an engine: its tokenizer and its model's name.
    engine = types.SimpleNamespace(
        get_tokenizer=lambda: tokenizer, model_config=types.SimpleNamespace(model=model)
    )
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    return ReasoningPath(engine, "deepseek_r1"), tokenizer, list(prompt)


def _stream(setup: tuple[Any, Any, list[int]], text: str, step: int, **options: Any) -> Any:
    """Feed the output of ``text`` in cumulative outputs of ``step`` tokens; the cut, or None."""
    from asyncbackends.adapters.vllm._reasoning import ThoughtStops

    path, tokenizer, prompt = setup
    ids = tokenizer.encode(text, add_special_tokens=False)
    watcher = ThoughtStops(path, prompt, STOPS, **options)
    for end in range(step, len(ids) + step, step):
        if watcher(tokenizer.decode(ids[:end]), ids[:end]):
            return watcher.cut, ids
    return None, ids


@pytest.mark.parametrize("step", [1, 3, 100])
def test_a_stop_ends_the_answer_at_the_token_that_completes_it(setup: Any, step: int) -> None:
    text = "The quick\n\nQuestion: brown</think>Paris is the capital\n\nQuestion: next"
    cut, ids = _stream(setup, text, step)
    assert cut is not None and cut.answer == "Paris is the capital"
    tokenizer = setup[1]
    assert tokenizer.decode(ids[: cut.tokens]).endswith("capital\n\n")  # the token completing "\n\n"
    assert not tokenizer.decode(ids[: cut.tokens - 1]).endswith("\n\n")


def test_the_earliest_completing_stop_wins(setup: Any) -> None:
    cut, _ = _stream(setup, "x</think>A Question: B\n\n", 1)
    assert cut is not None and cut.answer == "A "


def test_a_thought_that_never_closes_is_never_cut(setup: Any) -> None:
    assert _stream(setup, "The quick\n\nQuestion: brown fox", 2)[0] is None


def test_a_stop_within_the_first_min_tokens_does_not_count(setup: Any) -> None:
    # As vLLM: only a stop string that ends past the text of the first min_tokens tokens ends generation.
    text = "x</think>A\n\nB\n\nC"
    cut, ids = _stream(setup, text, 1)
    assert cut is not None and cut.answer == "A"
    first = len(setup[1].encode("x</think>A\n\n", add_special_tokens=False))
    assert ids[:first] == setup[1].encode("x</think>A\n\n", add_special_tokens=False)
    late, _ = _stream(setup, text, 1, min_tokens=first)
    assert late is not None and late.answer == "A\n\nB"
