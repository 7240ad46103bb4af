"""The tiny reasoning model: think tokens that decoding keeps, a template that opens the thought, and greedy
thoughts that close on some prompts and not on others (transformers on the same weights, no engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncbackends.testing._tiny_reasoning import THINK_END, THINK_START
from asyncbackends.testing.tiny_model import build_tiny_reasoning_model

PROMPTS = ("What is two plus two?", "Name the capital of France.", "hello there", "Tell me a story.")


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return build_tiny_reasoning_model()


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_think_tokens_are_single_tokens_kept_in_decoded_text(tokenizer: Any) -> None:
    for token in (THINK_START, THINK_END):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1
        assert tokenizer.decode(ids, skip_special_tokens=True) == token


def test_template_opens_the_thought_and_drops_earlier_thoughts(tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "pondering</think>\n\nhello"},
        {"role": "user", "content": "again"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|assistant|>\n<think>\n")
    assert "pondering" not in text and "<|assistant|>\nhello</s>" in text


def test_some_greedy_thoughts_close_within_16_tokens_and_some_do_not(model_dir: Path, tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    end = tokenizer.convert_tokens_to_ids(THINK_END)
    closed = []
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0][len(ids) :]
        closed.append(end in out.tolist())
    assert any(closed) and not all(closed), closed


def test_build_is_cached_and_reproducible(model_dir: Path, tmp_path: Path) -> None:
    assert build_tiny_reasoning_model() == model_dir
    again = build_tiny_reasoning_model(tmp_path / "reasoning")
    assert (again / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
