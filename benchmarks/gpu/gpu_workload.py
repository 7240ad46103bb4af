"""The synthetic model and the workload of ``gpu_throughput.py``: every process derives the same ones.

A model directory holds a config.json and a locally trained byte-level BPE tokenizer, no weights (vLLM draws
seeded random ones with ``load_format="dummy"``). Shapes: ``1b`` is meta-llama/Llama-3.2-1B's, ``8b`` is
Llama-3.1-8B's; the vocabulary is the trained tokenizer's (32000) in both.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

SHAPES: dict[str, dict[str, Any]] = {
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "rope_factor": 32.0,
    },
    "8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
        "rope_factor": 8.0,
    },
}


def log(*parts: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


# -- the synthetic model -------------------------------------------------------------------------------


def _words(rng: random.Random, count: int) -> list[str]:
    """Pronounceable made-up words; a few are very frequent, most rare, like a natural vocabulary."""
    onsets = [
        "",
        "b",
        "d",
        "f",
        "g",
        "k",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "z",
        "st",
        "tr",
        "pl",
        "sh",
    ]
    nuclei = ["a", "e", "i", "o", "u", "ea", "oo", "ai", "ie"]
    codas = ["", "", "n", "r", "s", "t", "ng", "ck", "ld"]
    return [
        "".join(rng.choice(onsets) + rng.choice(nuclei) + rng.choice(codas) for _ in range(rng.randint(1, 4)))
        for _ in range(count)
    ]


def _sentences(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    vocabulary = _words(rng, 50_000)
    weights = [1.0 / (rank + 10) for rank in range(len(vocabulary))]
    out = []
    for _ in range(count):
        words = rng.choices(vocabulary, weights, k=rng.randint(6, 30))
        tail = rng.choice([".", ".", ",", "?", "!", f" {rng.randint(0, 9999)}."])
        out.append(" ".join(words).capitalize() + tail)
    return out


def _train_tokenizer(directory: Path, vocab_size: int) -> tuple[int, int, int]:
    """Train and save the tokenizer (~5 minutes on 2 cores); return its vocabulary size, BOS and EOS ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_sentences(0, 120_000), trainer=trainer)
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072, **special}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    return tokenizer.get_vocab_size(), bos_id, eos_id


def _copy_tokenizer(source: Path, directory: Path) -> tuple[int, int, int]:
    """Reuse another model directory's tokenizer (a new shape needs no new training)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, directory / name)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    return tokenizer.get_vocab_size(), tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)


def build_model(
    directory: Path,
    shape: str = "1b",
    layers: int | None = None,
    tokenizer_from: Path | None = None,
    vocab_size: int = 32_000,
) -> None:
    """Write a Llama-shaped config.json and a tokenizer (trained, or copied from ``tokenizer_from``).

    The files are written as plain JSON, not through transformers, so any transformers version reads them.
    """
    if (directory / "config.json").is_file() and (directory / "tokenizer.json").is_file():
        log(f"model directory {directory} exists")
        return
    start = time.perf_counter()
    if tokenizer_from is not None:
        vocab, bos_id, eos_id = _copy_tokenizer(tokenizer_from, directory)
    else:
        vocab, bos_id, eos_id = _train_tokenizer(directory, vocab_size)
    dims = dict(SHAPES[shape])
    rope_factor = dims.pop("rope_factor")
    if layers is not None:
        dims["num_hidden_layers"] = layers
    config = {  # the Llama model's shape; the vocabulary is the trained tokenizer's
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        **dims,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": rope_factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    took = time.perf_counter() - start
    log(f"model directory {directory} ({shape}) built in {took:.1f}s (vocab {config['vocab_size']})")


# -- the workload (every process derives the same one from the seed) -----------------------------------


def generation_prompts(count: int, vocab: int, seed: int = 1) -> list[list[int]]:
    """Eval-shaped prompts: 32 to 512 token ids each, away from the special and byte tokens."""
    rng = random.Random(seed)
    return [[rng.randrange(300, vocab) for _ in range(rng.randint(32, 512))] for _ in range(count)]


def scoring_pairs(count: int, seed: int = 2) -> list[tuple[str, str]]:
    """(context, continuation) texts: a context of a few to ~20 sentences, a continuation of 1-8 words."""
    sentences = _sentences(seed, 4000)
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        context = " ".join(rng.choices(sentences, k=rng.randint(2, 20)))
        continuation = " " + " ".join(rng.choice(sentences).split()[: rng.randint(1, 8)])
        pairs.append((context, continuation))
    return pairs
