"""A tiny random LoRA adapter for a local base model, built with peft: a real adapter directory, no download.

Tests and benchmarks of per-request adapters (issue 51) need several adapters that change a model's outputs.
A freshly initialised LoRA changes nothing (peft draws B as zeros), so both A and B are drawn here from a
seeded normal distribution: every adapter of another seed gives other outputs, the same seed the same ones.

The adapter covers the projections vLLM serves LoRA on for a Llama (the attention's q, k, v and o, the MLP's
gate, up and down; not the embeddings or the LM head, which vLLM no longer takes in an adapter) and is saved
as peft saves any adapter (``adapter_config.json`` and ``adapter_model.safetensors``), the directory vLLM's
``LoRARequest`` and ``vllm serve --lora-modules`` read and ``PeftModel.from_pretrained`` loads.

Only the base's ``config.json`` is read (the shapes): its weights are neither loaded nor needed. The directory
is built once and cached under `asyncbackends.testing.tiny_model.default_cache_dir`, in a folder named after a
hash of the base's identity (its resolved path and the bytes of its config), the rank, the seed and the
recipe, so another base, rank, seed or recipe builds another one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .._install import pip_install
from ._model_dir import build_atomically

__all__ = ["TINY_LORA_TARGET_MODULES", "build_tiny_lora"]

# Bump when the build changes in a way the hashed inputs below do not capture.
_RECIPE = "tiny-lora/1"
_STD = 0.1
"""The standard deviation of every A and B entry: with the tiny Llama (weights of std 0.08) a rank-8 adapter
moves logits by about as much as the base weights set them, so greedy outputs and loglikelihoods differ."""

TINY_LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The Llama projections the adapter covers (all that vLLM applies LoRA to in a Llama's decoder layers)."""

_ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
_PEFT_HINT = f"pip install peft (or: {pip_install('lora')})"


def build_tiny_lora(
    base: str | os.PathLike[str], rank: int = 8, seed: int = 0, *, path: str | os.PathLike[str] | None = None
) -> Path:
    """Build a random LoRA adapter for the local model ``base`` if it is not there yet, and return its path.

    Args:
        base: A local model directory with a ``config.json`` (e.g. `build_tiny_model`'s).
        rank: The adapter's rank ``r`` (``lora_alpha`` is ``2 * rank``).
        seed: The seed its A and B matrices are drawn from; other seeds give other adapters.
        path: Where to put it; ``None`` uses ``default_cache_dir() / "tiny-lora-<hash>"``.

    Returns:
        A peft adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) whose
        ``base_model_name_or_path`` is ``base``.

    Raises:
        ImportError: peft is not installed (the message gives the pip command).
        FileNotFoundError: ``base`` holds no ``config.json``.
        ValueError: ``rank`` is not a positive int.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be a positive int, got {rank!r}")
    base_dir = Path(base).expanduser().resolve()
    config = base_dir / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"not a local model directory (no config.json): {os.fspath(base)!r}")
    _import_peft()  # first: a missing peft is the likeliest failure, and its message says what to do
    if path is not None:
        target = Path(path)
    else:
        from ._tiny_llama import default_cache_dir

        target = default_cache_dir() / f"tiny-lora-{_version_hash(base_dir, config.read_bytes(), rank, seed)}"
    if all((target / name).is_file() for name in _ADAPTER_FILES):
        return target
    return build_atomically(
        target, lambda directory: _write_adapter(directory, base_dir, rank, seed), marker=_ADAPTER_FILES[0]
    )


def _version_hash(base: Path, config: bytes, rank: int, seed: int) -> str:
    config_digest = hashlib.sha256(config).hexdigest()
    parts = [_RECIPE, str(base), config_digest, rank, seed, _STD, TINY_LORA_TARGET_MODULES]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def _import_peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise ImportError(f"build_tiny_lora needs peft, which is not installed: {_PEFT_HINT}") from exc
    return peft


def _write_adapter(directory: Path, base: Path, rank: int, seed: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    peft = _import_peft()
    config = AutoConfig.from_pretrained(base)
    with torch.random.fork_rng(devices=[]):  # the caller's random state is not disturbed
        # The base's own weights play no part in the adapter: a random model of its shape carries the LoRA.
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        lora = peft.LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            lora_dropout=0.0,
            target_modules=list(TINY_LORA_TARGET_MODULES),
            bias="none",
            task_type="CAUSAL_LM",
            init_lora_weights=False,
        )
        peft_model = peft.get_peft_model(model, lora)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            # Sorted by name: the draws, hence the adapter, do not depend on the module traversal's order.
            for name, parameter in sorted(peft_model.named_parameters()):
                if "lora_A" in name or "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * _STD)
    peft_model.peft_config["default"].base_model_name_or_path = str(base)
    peft_model.save_pretrained(directory, safe_serialization=True)
