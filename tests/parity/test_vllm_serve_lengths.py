"""Prompt plus ``max_tokens`` past the model's length, against a real ``vllm serve`` (issue 53 item 13).

vLLM 0.32's server refuses ``max_tokens`` greater than ``max_model_len`` with a 400 before it renders anything
(its tokenization parameters), and clamps a smaller ``max_tokens`` to what the prompt leaves (``get_max_tokens``):
a 481-token prompt with ``max_tokens=100`` at ``max_model_len=512`` gets 31 tokens, ``finish_reason="length"``.
The in-process adapter does the same: it refuses the first with `ContextLengthError` before sending (never
retried), and returns the second's 31 tokens as the server does.
"""

from __future__ import annotations

import urllib.error
from typing import Any

import pytest

import asyncbackends as ab

from ..tiny_engine import ENGINE_OPTIONS
from ..vllm_serve import Pair

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_MODEL_LEN = ENGINE_OPTIONS["max_model_len"]


def _prompt(backend: Any, tokens: int) -> str:
    """A text that encodes (BOS included) to exactly ``tokens`` tokens."""
    text = " ".join(["the quick brown fox"] * tokens)
    ids = backend.tokenizer.encode(text, add_special_tokens=True)[:tokens]
    out: str = backend.tokenizer.decode(ids[1:])
    assert len(backend.tokenizer.encode(out, add_special_tokens=True)) == tokens
    return out


def test_a_max_tokens_the_prompt_leaves_no_room_for_is_clamped_as_by_vllm_serve(reasoning_pair: Pair) -> None:
    text = _prompt(reasoning_pair.backend, 481)
    served = reasoning_pair.complete(text, max_tokens=100)
    params = ab.SamplingParams(max_tokens=100, temperature=0)
    (result,) = ab.run_batch(reasoning_pair.backend, [ab.GenerationRequest(text, params)])
    (completion,) = result.completions
    assert result.prompt_tokens == served["usage"]["prompt_tokens"] == 481
    assert list(completion.token_ids) == served["choices"][0]["token_ids"]
    assert len(completion.token_ids) == MAX_MODEL_LEN - 481
    assert completion.finish_reason == served["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("chat", [False, True], ids=["text", "chat"])
def test_max_tokens_over_max_model_len_is_refused_before_sending_as_by_vllm_serve(
    reasoning_pair: Pair, chat: bool
) -> None:
    max_tokens = MAX_MODEL_LEN + 1
    prompt: Any = [{"role": "user", "content": "hi"}] if chat else "hi"
    ask = reasoning_pair.chat if chat else reasoning_pair.complete
    with pytest.raises(urllib.error.HTTPError) as refused:
        ask(prompt, max_tokens=max_tokens)
    assert refused.value.code == 400
    assert f"max_tokens={max_tokens} cannot be greater than max_model_len={MAX_MODEL_LEN}" in str(
        refused.value.__notes__
    )
    engine = reasoning_pair.backend.engine
    add_request, sent = engine.add_request, []

    async def counted(*args: Any, **kwargs: Any) -> Any:
        sent.append(args)
        return await add_request(*args, **kwargs)

    request = ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=max_tokens))
    engine.add_request = counted
    try:
        with pytest.raises(ab.ContextLengthError, match="cannot be greater than max_model_len") as caught:
            ab.run_batch(reasoning_pair.backend, [request], retry=ab.RetryPolicy(max_attempts=3))
    finally:
        del engine.add_request
    assert sent == [] and not caught.value.retryable


@pytest.mark.parametrize("chat", [False, True], ids=["text", "chat"])
def test_the_openai_adapter_reads_the_same_refusal_as_a_context_length_error(
    reasoning_pair: Pair, chat: bool
) -> None:
    prompt: Any = [{"role": "user", "content": "hi"}] if chat else "hi"
    backend = ab.create_backend("openai", base_url=reasoning_pair.url + "/v1", model=reasoning_pair.model)
    request = ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=MAX_MODEL_LEN + 1))
    try:
        with pytest.raises(ab.ContextLengthError, match="cannot be greater than max_model_len") as caught:
            ab.run_batch(backend, [request], timeout=ab.Timeouts(total=120, idle=None))
    finally:
        backend.close()
    assert not caught.value.retryable
