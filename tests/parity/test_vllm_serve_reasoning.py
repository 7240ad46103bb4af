"""Where the reasoning split applies, against a real ``vllm serve --reasoning-parser deepseek_r1``: per endpoint.

The server applies its reasoning parser to ``/v1/chat/completions`` only; ``/v1/completions`` returns a text
prompt's output whole, even where it holds ``</think>``. The in-process adapter (built with the same parser)
follows the same rule: a text prompt is the completions endpoint, a chat the chat endpoint (issue 53 item 12).
"""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab

from ..vllm_serve import Pair

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_TOKENS = 24
TEXTS = ("What is 2+2?", "What is two plus two?", "<|user|>\nhello there</s>\n<|assistant|>\n<think>\n")
"""Text prompts; the last is the chat template's rendering by hand, so its output closes a thought."""


def _generate(backend: Any, prompt: Any, **params: Any) -> ab.Completion:
    request = ab.GenerationRequest(prompt, ab.SamplingParams(temperature=0, max_tokens=MAX_TOKENS, **params))
    [completion] = ab.get_loop_manager().run(backend.generate(request)).completions
    return completion  # type: ignore[no-any-return]


@pytest.mark.parametrize("text", TEXTS)
def test_a_text_prompts_output_comes_back_whole_as_from_v1_completions(
    reasoning_pair: Pair, text: str
) -> None:
    whole = reasoning_pair.complete(text, max_tokens=MAX_TOKENS)
    served = whole["choices"][0]
    completion = _generate(reasoning_pair.backend, text)
    assert list(completion.token_ids) == served["token_ids"]
    # The completions endpoint counts no thinking: no details, or 0 (the chat endpoint's count is checked
    # in tests/reasoning/test_vllm_serve_reasoning.py).
    assert not (whole["usage"].get("completion_tokens_details") or {}).get("reasoning_tokens")
    assert (completion.text, completion.reasoning) == (served["text"], None)
    assert (completion.reasoning_tokens, completion.reasoning_truncated) == (0, False)
    assert completion.finish_reason == served["finish_reason"]


def test_the_hand_rendered_prompts_output_holds_a_closed_thought(reasoning_pair: Pair) -> None:
    # What makes the case above a real one: as a text prompt the thought's end is in the text, while the same
    # conversation as a chat is split by both (the chat endpoint's rule).
    whole = _generate(reasoning_pair.backend, TEXTS[-1])
    assert "</think>" in whole.text
    chat = [{"role": "user", "content": "hello there"}]
    split = _generate(reasoning_pair.backend, chat)
    served = reasoning_pair.chat(chat, max_tokens=MAX_TOKENS)["choices"][0]
    assert list(split.token_ids) == list(whole.token_ids) == served["token_ids"]
    assert split.reasoning == served["message"]["reasoning"] is not None
    assert split.text == served["message"]["content"] and "</think>" not in split.text


def test_a_stop_string_ends_a_text_prompts_output_inside_the_thought_as_v1_completions(
    reasoning_pair: Pair,
) -> None:
    text = TEXTS[-1]
    free = _generate(reasoning_pair.backend, text)
    stop = free.text[2:4]  # inside the thought: the completions endpoint stops there all the same
    served = reasoning_pair.complete(text, max_tokens=MAX_TOKENS, stop=[stop])["choices"][0]
    stopped = _generate(reasoning_pair.backend, text, stop=(stop,))
    assert (
        (stopped.text, stopped.finish_reason)
        == (served["text"], served["finish_reason"])
        == (
            free.text[: free.text.index(stop)],
            "stop",
        )
    )
