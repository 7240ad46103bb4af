"""Tiny models with the main tokenizer families, built locally, and scoring cases that merge at the boundary.

Three families, each trained in-process with the ``tokenizers`` library on a corpus full of the boundary
merges scoring has to get right (digits, punctuation, trailing spaces, CJK, emoji):

- ``gpt2``: byte-level BPE with GPT-2's pre-tokenizer (`` ?\\p{N}+``: " 42" is one piece), no BOS added,
  one ``<|endoftext|>`` for BOS and EOS.
- ``llama3``: byte-level BPE with Llama 3's split pattern (digits in groups of up to three, apart from the
  space) and ``<|begin_of_text|>`` put in front of every text.
- ``unigram``: a SentencePiece-style Unigram model (Metaspace ``▁``, the first word prefixed) with ``<s>`` in
  front of every text, as Llama 2 and Gemma tokenizers do.

Every family's model has the same architecture and seed (`asyncbackends.testing.tiny_model`), sized to its
vocabulary. Importing this module imports no engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

FAMILIES = ("gpt2", "llama3", "unigram")

_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

_CORPUS = [
    "The answer is 42. The answer is 42! The year is 2026, and pi is 3.14159.",
    "Question: what is 6 times 7? Answer: 42.",
    "Wait... what?! Really?? Yes!!! No... maybe.",
    "Hello world! Hello there, world. Goodbye, world...",
    "你好世界。你好，世界！东京是日本的首都。北京是中国的首都。",  # noqa: RUF001
    "I like it 👍👍🏽 so much 🎉🎉🎉 party 😀😃😄",
    "naïve café résumé déjà vu",
    "Answer: B\nAnswer: C\n\nAnswer: D",
    "def add(a, b):\n    return a + b\n",
    "The capital of France is Paris. The capital of Japan is Tokyo.",
]

CASES: list[tuple[str, str]] = [
    ("The answer is 4", "2."),  # " 42" one token: lm-eval scores "." after " 4"
    ("The answer is 4", "2"),  # merges whole into the context's last token
    ("The year is 20", "26"),
    ("pi is 3.", "14159"),
    ("Wait..", ". what?!"),
    ("Really?", "? Yes!!"),
    ("Hello", " world!"),  # no merge: a control
    ("Answer: ", "B"),  # trailing space moves to the continuation
    ("Answer:\n\n", "D"),
    ("The capital of France is ", "Paris."),
    ("你好", "世界。"),
    ("北京是中国", "的首都。"),
    ("I like it 👍", "🏽 so much"),
    ("party 😀", "😃😄"),
    ("naïv", "e café"),
    ("", "Hello world!"),  # empty context: the BOS or EOS stands in
    ("", "你好世界"),
]
"""(context, continuation) pairs; most merge across the boundary in at least one family."""


def build_family_model(family: str, directory: Path) -> Path:
    """Write a tiny random-weight Llama with ``family``'s tokenizer into ``directory`` and return it."""
    from asyncbackends.testing._tiny_llama import TINY_MODEL_CONFIG, random_model

    if (directory / "config.json").is_file():
        return directory
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer(family)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
        dtype="float32",
        **TINY_MODEL_CONFIG,
    )
    random_model(LlamaForCausalLM, config, 1234).save_pretrained(directory, safe_serialization=True)
    return directory


def planned(
    family: str, tokenizer: Any, context: str, continuation: str, split: Any
) -> tuple[list[int], int]:
    """(prompt, scored) the adapters plan for a pair with ``family``'s tokenizer (its BOS the stand-in)."""
    from asyncbackends.adapters._scoring import plan_loglikelihood

    bos = tokenizer.bos_token_id
    plan = plan_loglikelihood(
        context,
        continuation,
        encode=lambda text: list(tokenizer(text, add_special_tokens=False).input_ids),
        prefix=() if family == "gpt2" else (bos,),  # GPT-2's tokenizer adds no BOS; the others add one
        empty_context_token=bos,
        max_prompt_tokens=10_000,
        split=split,
    )
    assert plan is not None
    return list(plan.token_ids), plan.scored


def family_model(request: Any, tmp_path_factory: Any) -> tuple[str, Path]:
    """A module fixture's (family, model directory) for its parameter (a family's name)."""
    family = str(request.param)
    return family, build_family_model(family, tmp_path_factory.mktemp(family))


def vllm_backend_on(directory: Path) -> Iterator[Any]:
    """A fixture's ``vllm`` backend on ``directory`` (the suite's engine settings), closed afterwards."""
    import asyncbackends as ab

    from ..tiny_engine import build_backend

    backend = build_backend(str(directory))
    yield backend
    ab.get_loop_manager().run(backend.aclose())


def build_tokenizer(family: str) -> Any:
    """A ``PreTrainedTokenizerFast`` of ``family`` trained on the boundary-merge corpus."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = _CORPUS * 20
    if family == "unigram":
        special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
        core = Tokenizer(models.Unigram())
        core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        core.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        trainer: Any = trainers.UnigramTrainer(
            vocab_size=400, special_tokens=list(special.values()), unk_token="<unk>", show_progress=False
        )
    else:
        if family == "gpt2":
            special = {
                "bos_token": "<|endoftext|>",
                "eos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
            }
            pre: Any = pre_tokenizers.ByteLevel(add_prefix_space=False)
        elif family == "llama3":
            special = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
            pre = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(_LLAMA3_PATTERN), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        else:
            raise ValueError(f"unknown tokenizer family {family!r}")
        core = Tokenizer(models.BPE())
        core.pre_tokenizer = pre
        core.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=sorted(set(special.values())),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    core.train_from_iterator(corpus, trainer=trainer)
    if family != "gpt2":  # a BOS in front of every text unless special tokens are off
        bos = special["bos_token"]
        core.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, core.token_to_id(bos))]
        )
    return PreTrainedTokenizerFast(tokenizer_object=core, model_max_length=2048, **special)  # type: ignore[no-untyped-call]
