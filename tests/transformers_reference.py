"""transformers on the same weights as the scoring reference: each scored token's logprob, one prompt at a time."""

from __future__ import annotations

from typing import Any


def token_logprobs(model: Any, token_ids: list[int], scored: int) -> tuple[list[float], bool]:
    """Each of the last ``scored`` tokens' logprob under ``model``, and whether every one was the argmax."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].log_softmax(-1)
    parts, greedy = [], True
    for pos in range(len(token_ids) - scored, len(token_ids)):
        row = logits[pos - 1]
        parts.append(row[token_ids[pos]].item())
        greedy &= int(row.argmax()) == token_ids[pos]
    return parts, greedy
