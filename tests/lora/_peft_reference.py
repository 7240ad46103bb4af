"""transformers + peft as the scoring reference of tests/lora: the same weights, float32 (scored by
`tests.transformers_reference.token_logprobs`, one prompt at a time)."""

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
