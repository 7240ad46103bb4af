"""Scores through the lighteval integration against lighteval's own vLLM model, token boundaries included.

lighteval's ``tok_encode_pair`` (non-pairwise, its default) scores the whole text's tokens: the prompt is
context plus continuation encoded as one text, the continuation what lies beyond the context's token count
(the last token where it merged whole into the context). That is a plain `LoglikelihoodRequest`'s split, which
the lighteval integration sends. Two layers, as in test_lm_eval_scoring.py:

- the tokens, no engine, every tokenizer family and case: lighteval's own ``tok_encode_pair`` (its
  ``VLLMModel`` class, engine not started) against the prompt the adapters plan;
- the scores, on tiny models of each family with the same weights: lighteval's ``VLLMModel`` (its engine;
  `_lighteval_vllm` says what lets lighteval 0.13 run on vLLM 0.32) against `AsyncBackendsModel` on the ``vllm`` adapter: logprob and argmax_logits_eq_gold per choice.

Empty contexts are left out for the GPT-2 family: lighteval's model then scores the prompt's first token,
which has no logprob, and fails (a TypeError in its own code).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lighteval")
pytest.importorskip("vllm")

from lighteval.tasks.requests import Doc

from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

from ..tiny_engine import ENGINE_OPTIONS
from ._lighteval_vllm import lighteval_llm, vllm_model
from ._split_references import lighteval_pair
from ._tokenizer_families import CASES, FAMILIES, build_tokenizer, family_model, planned, vllm_backend_on

pytestmark = [
    # vLLM's engine shutdown leaves a ZMQ context for the garbage collector (reported to the adapter).
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _cases(family: str) -> list[tuple[str, str]]:
    return [case for case in CASES if case[0] or family != "gpt2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_planned_tokens_are_lighteval_tok_encode_pair(family: str) -> None:
    tokenizer = build_tokenizer(family)
    for context, continuation in _cases(family):
        case = f"{family}: {context!r} + {continuation!r}"
        want = lighteval_pair(tokenizer, context, continuation)
        assert planned(family, tokenizer, context, continuation, "whole") == want, case


# -- the scores, with engines ------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=FAMILIES, name="family_model")
def _family_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    return family_model(request, tmp_path_factory)


@pytest.fixture(scope="module")
def lighteval_reference(
    family_model: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    config = vllm_model.VLLMModelConfig(
        model_name=str(family_model[1]),
        dtype=ENGINE_OPTIONS["dtype"],
        gpu_memory_utilization=ENGINE_OPTIONS["gpu_memory_utilization"],
        max_model_length=ENGINE_OPTIONS["max_model_len"],
        cache_dir=str(tmp_path_factory.mktemp("lighteval-cache")),
    )
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        patch.setattr(vllm_model, "LLM", lighteval_llm)
        model = vllm_model.VLLMModel(config)
    yield model
    del model.model, model
    # vLLM's LLM leaves a ZMQ context in a reference cycle: collected here, its ResourceWarning silenced,
    # rather than by whichever later test (or pytest's session end, which fails the run) meets it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture(scope="module")
def ours(family_model: tuple[str, Path]) -> Iterator[Any]:
    yield from vllm_backend_on(family_model[1])


def _docs(family: str) -> list[Doc]:
    return [
        Doc(query=context, choices=[continuation], gold_index=0, task_name="parity|0", id=str(i))
        for i, (context, continuation) in enumerate(_cases(family))
    ]


@pytest.mark.vllm
@pytest.mark.slow
def test_scores_equal_lighteval_vllm_model(
    family_model: tuple[str, Path], lighteval_reference: Any, ours: Any, tmp_path: Path
) -> None:
    family = family_model[0]
    want = lighteval_reference.loglikelihood(_docs(family))
    config = AsyncBackendsModelConfig(model_name="ours", cache_dir=str(tmp_path), progress=False)
    got = AsyncBackendsModel(config, backend=ours).loglikelihood(_docs(family))
    for case, ours_doc, ref_doc in zip(_cases(family), got, want, strict=True):
        label = f"{family}: {case}"
        assert ours_doc.logprobs == pytest.approx(ref_doc.logprobs, abs=1e-4), label
        assert ours_doc.argmax_logits_eq_gold == ref_doc.argmax_logits_eq_gold, label
