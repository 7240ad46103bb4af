"""A tiny random-weight Llama with a locally trained tokenizer: a real model directory, no download.

Tests, docs and ``make demo`` share it: any engine that loads Hugging Face model directories (vLLM,
transformers) can load it, and because its weights come from a fixed ``torch.manual_seed`` the same directory
gives the same outputs in every engine, which makes transformers an independent reference for vLLM.

The directory is built once and cached under ``~/.cache/asyncbackends/`` (or ``$ASYNCBACKENDS_CACHE_DIR``),
in a folder named after a hash of everything that shapes it, so a change to the recipe builds a new one.
Its recipe (the Llama shape, the tokenizer's corpus, seeded weights) is shared by the vision-language and
reasoning siblings (`asyncbackends.testing._tiny_vlm`, `asyncbackends.testing._tiny_reasoning`); users import
all three from `asyncbackends.testing.tiny_model`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ._model_dir import build_atomically

__all__ = ["CHAT_TEMPLATE", "TINY_MODEL_CONFIG", "build_tiny_model", "default_cache_dir"]

# Bump when the build changes in a way the hashed inputs below do not capture.
_RECIPE = "tiny-llama/1"
_SEED = 1234
_VOCAB_SIZE = 512

TINY_MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    # vLLM's CPU attention kernel refuses small head sizes (16 fails); 64 works.
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
"""The Llama shape (vocabulary size and special token ids are filled in from the tokenizer)."""

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""A minimal chat template: one ``<|role|>`` header per turn, each turn closed by the EOS token."""

_SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}

_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "Question: What is two plus two? Answer: four.",
    "Once upon a time there was a small model that lived on a CPU.",
    "def add(a, b):\n    return a + b\n",
    "The answer is 42. The sky is blue. Water boils at 100 degrees Celsius.",
    "user: hello there\nassistant: hello, how can I help you today?",
    "Evaluation harnesses send many requests; an engine batches them for throughput.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20.",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z a b c d e f g h i j k l m n o p q r s t u v w x y z",
)


def default_cache_dir() -> Path:
    """Where built models are cached: ``$ASYNCBACKENDS_CACHE_DIR`` or ``~/.cache/asyncbackends``."""
    override = os.environ.get("ASYNCBACKENDS_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "asyncbackends"


def _version_hash() -> str:
    recipe = {
        "recipe": _RECIPE,
        "seed": _SEED,
        "vocab": _VOCAB_SIZE,
        "config": TINY_MODEL_CONFIG,
        "chat_template": CHAT_TEMPLATE,
        "special": _SPECIAL,
        "corpus": _CORPUS,
    }
    blob = json.dumps(recipe, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def build_tiny_model(path: str | os.PathLike[str] | None = None) -> Path:
    """Build the tiny model directory if it is not there yet, and return its path.

    Args:
        path: Where to put it; ``None`` uses ``default_cache_dir() / "tiny-llama-<hash>"``.

    Returns:
        A directory holding ``config.json``, the weights and a ``PreTrainedTokenizerFast`` with bos/eos/unk
        tokens and a chat template.
    """
    target = Path(path) if path is not None else default_cache_dir() / f"tiny-llama-{_version_hash()}"
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    return build_atomically(target, _write_model)


def _write_model(directory: Path) -> None:
    from transformers import LlamaForCausalLM

    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(directory)
    random_model(LlamaForCausalLM, llama_config(tokenizer), _SEED).save_pretrained(
        directory, safe_serialization=True
    )


def llama_config(tokenizer: Any) -> Any:
    """The `TINY_MODEL_CONFIG` Llama configuration for ``tokenizer`` (its vocabulary and special tokens)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
        dtype="float32",
        **TINY_MODEL_CONFIG,
    )


def random_model(model_class: Any, config: Any, seed: int) -> Any:
    """``model_class(config)`` with weights drawn from ``seed`` (the tiny models' shared initialisation)."""
    import torch

    # Fork the RNG so building the model inside a test does not disturb the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
        # Random init gives nearly uniform next-token distributions; larger weights make greedy choices
        # and loglikelihoods clearly distinct, which makes comparisons between engines meaningful.
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() > 1:
                    parameter.normal_(0.0, 0.08)
    return model


def _train_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(_SPECIAL.values())
    core = Tokenizer(models.BPE(unk_token=_SPECIAL["unk_token"]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_CORPUS, trainer=trainer)
    bos = _SPECIAL["bos_token"]
    # Like Llama's tokenizer: a BOS token in front of every encoded text unless special tokens are off.
    core.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, core.token_to_id(bos))]
    )
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, model_max_length=2048, **_SPECIAL
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
