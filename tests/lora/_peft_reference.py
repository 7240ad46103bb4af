"""transformers + peft as the scoring reference of tests/lora: the same weights, float32, one prompt at a time."""

from __future__ import annotations

from typing import Any


def load_peft_models(base_model: str, adapters: dict[str, str]) -> dict[str, Any]:
    """The plain base (``""``) and each adapter on its own copy of the base, in eval mode."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    def base() -> Any:
        return AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32).eval()

    models = {"": base()}
    for name, path in adapters.items():
        models[name] = PeftModel.from_pretrained(base(), path).eval()
    return models


def peft_score(model: Any, token_ids: list[int], scored: int) -> tuple[list[float], bool]:
    """Each of the last ``scored`` tokens' logprob, and whether every one was the unique argmax."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].log_softmax(-1)
    parts, greedy = [], True
    for pos in range(len(token_ids) - scored, len(token_ids)):
        row = logits[pos - 1]
        parts.append(row[token_ids[pos]].item())
        greedy &= int(row.argmax()) == token_ids[pos]
    return parts, greedy
