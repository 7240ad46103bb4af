"""Tiny random-weight models built locally, no download: a Llama, its reasoning and vision-language siblings.

Tests, docs and ``make demo`` share them: any engine that loads Hugging Face model directories (vLLM,
transformers) can load them, and because their weights come from a fixed ``torch.manual_seed`` the same
directory gives the same outputs in every engine, which makes transformers an independent reference for vLLM.

Each is built once and cached under ``~/.cache/asyncbackends/`` (or ``$ASYNCBACKENDS_CACHE_DIR``), in a folder
named after a hash of everything that shapes it, so a change to a recipe builds a new one.
``python -m asyncbackends.testing.tiny_model [PATH] [--kind plain|reasoning|vlm]`` builds one and prints its
path. `build_tiny_model` builds the Llama (`asyncbackends.testing._tiny_llama`), `build_tiny_vlm` its
vision-language sibling (images and tools; `asyncbackends.testing._tiny_vlm`), `build_tiny_reasoning_model`
its reasoning sibling (``<think>...</think>``; `asyncbackends.testing._tiny_reasoning`). `build_tiny_lora`
builds a random LoRA adapter for one of them with peft (`asyncbackends.testing._tiny_lora`; needs ``peft``).
"""

from ._tiny_llama import CHAT_TEMPLATE, TINY_MODEL_CONFIG, build_tiny_model, default_cache_dir
from ._tiny_lora import build_tiny_lora
from ._tiny_reasoning import build_tiny_reasoning_model
from ._tiny_vlm import build_tiny_vlm

__all__ = [
    "CHAT_TEMPLATE",
    "TINY_MODEL_CONFIG",
    "build_tiny_lora",
    "build_tiny_model",
    "build_tiny_reasoning_model",
    "build_tiny_vlm",
    "default_cache_dir",
]

if __name__ == "__main__":
    from ._tiny_model_cli import main

    main()
