r"""A tiny random-weight reasoning model: the tiny Llama that thinks in ``<think>...</think>``, no download.

Built like DeepSeek-R1 is served: ``<think>`` and ``</think>`` are ordinary added tokens (not special ones),
so they stay in decoded text and a server's reasoning parser (``vllm serve --reasoning-parser deepseek_r1``)
sees them; the chat template opens the thought at the generation prompt (``<|assistant|>\n<think>\n``), so the
model's output starts inside the thought and holds only the closing ``</think>``, as R1's does. The template
drops the thinking of earlier assistant turns, as R1's does.

The weights are random (fixed seed), but the ``lm_head`` row of ``</think>`` is scaled up so that the token
wins the greedy choice at some positions: some thoughts close within a few tokens, others run past a short
``max_tokens`` (tests pick prompts of both kinds, and force a close with a logit bias or a thinking budget).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ._model_dir import build_atomically

__all__ = ["THINK_END", "THINK_START", "TINY_REASONING_CHAT_TEMPLATE", "build_tiny_reasoning_model"]

_RECIPE = "tiny-reasoning/1"
_SEED = 2718
THINK_START = "<think>"
"""The token that opens a thought (written by the chat template at the generation prompt)."""
THINK_END = "</think>"
"""The token that closes a thought; the model generates it."""
# How much larger than the other rows the lm_head row of THINK_END is: large enough that some greedy thoughts
# close within ~16 tokens, small enough that others run on (measured on the prompts the tests use).
_END_ROW_SCALE = 5.0

TINY_REASONING_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}{% endif %}"
    "<|{{ message['role'] }}|>\n{{ content }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n<think>\n{% endif %}"
)
"""One ``<|role|>`` header per turn; the generation prompt opens the thought; earlier thoughts are dropped."""


def _version_hash() -> str:
    from ._tiny_llama import _version_hash as text_hash

    # The text model's hash covers its shape, tokenizer recipe and initialisation; add what this one changes.
    parts = [
        _RECIPE,
        _SEED,
        text_hash(),
        TINY_REASONING_CHAT_TEMPLATE,
        THINK_START,
        THINK_END,
        _END_ROW_SCALE,
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def build_tiny_reasoning_model(path: str | os.PathLike[str] | None = None) -> Path:
    """Build the tiny reasoning model directory if it is not there yet, and return its path.

    Args:
        path: Where to put it; ``None`` uses ``default_cache_dir() / "tiny-reasoning-<hash>"``.

    Returns:
        A directory holding a ``LlamaForCausalLM`` (``config.json``, weights) and its tokenizer, with
        ``<think>`` / ``</think>`` as added tokens that decoding keeps and a chat template that opens the
        thought (`TINY_REASONING_CHAT_TEMPLATE`). vLLM's ``deepseek_r1`` reasoning parser splits its output.
    """
    from ._tiny_llama import default_cache_dir

    target = Path(path) if path is not None else default_cache_dir() / f"tiny-reasoning-{_version_hash()}"
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    return build_atomically(target, _write_model)


def _write_model(directory: Path) -> None:
    import torch
    from tokenizers import AddedToken
    from transformers import LlamaForCausalLM

    from ._tiny_llama import _train_tokenizer, llama_config, random_model

    tokenizer = _train_tokenizer()
    # Not special: as DeepSeek-R1's, they survive skip_special_tokens, which the server's parser relies on.
    tokenizer.add_tokens(
        [AddedToken(token, special=False, normalized=False) for token in (THINK_START, THINK_END)]
    )
    tokenizer.chat_template = TINY_REASONING_CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    model = random_model(LlamaForCausalLM, llama_config(tokenizer), _SEED)
    with torch.no_grad():
        model.lm_head.weight[tokenizer.convert_tokens_to_ids(THINK_END)] *= _END_ROW_SCALE
    model.save_pretrained(directory, safe_serialization=True)
