"""The mock's reasoning model: what it thinks before it answers, and how ``max_tokens`` cuts it.

The mock thinks by reading its prompt backwards: the thought is the prompt text reversed, its length
scaled by ``reasoning_effort`` (`EFFORT_SHARE`: ``"none"`` no thought, ``"minimal"`` a quarter, ``"low"``
half, ``"medium"`` (the default) the whole reversed prompt, ``"high"`` twice it), then capped by
``thinking_budget``. One character is one token, as everywhere in the mock. A reversed prompt holds the
prompt's newlines and punctuation, so answer-level stop strings occur inside thoughts, as in real ones.
"""

from __future__ import annotations

import math
from typing import Literal

from .._sampling_params import SamplingParams

__all__ = ["EFFORT_SHARE", "ThinkingMode", "thought_of"]

ThinkingMode = Literal["off", "split", "inline"]
"""``off``: no thought; ``split``: the thought in `Completion.reasoning`; ``inline``: in the text."""

THINK_END = "</think>"
"""What closes an inline thought (its 8 characters are 8 tokens; the prompt opens the thought)."""

EFFORT_SHARE: dict[str, float] = {"none": 0.0, "minimal": 0.25, "low": 0.5, "medium": 1.0, "high": 2.0}
"""The thought's length as a share of the prompt's, by ``reasoning_effort`` (``None`` reads ``"medium"``)."""


def thought_of(prompt_text: str, params: SamplingParams) -> str:
    """The whole thought for a prompt under ``params``' effort and budget (before ``max_tokens`` cuts it)."""
    share = EFFORT_SHARE[params.reasoning_effort or "medium"]
    length = math.ceil(len(prompt_text) * share)
    if params.thinking_budget is not None:
        length = min(length, params.thinking_budget)
    backwards = prompt_text[::-1]
    return (backwards * math.ceil(share or 1))[:length]
