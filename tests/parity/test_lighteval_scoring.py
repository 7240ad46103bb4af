"""Scores through the lighteval integration against lighteval's own vLLM model, token boundaries included.

lighteval's ``tok_encode_pair`` (non-pairwise, its default) scores the whole text's tokens: the prompt is
context plus continuation encoded as one text, the continuation what lies beyond the context's token count
(the last token where it merged whole into the context). That is a plain `LoglikelihoodRequest`'s split, which
the lighteval integration sends. Two layers, as in test_lm_eval_scoring.py:

- the tokens, no engine, every tokenizer family and case: lighteval's own ``tok_encode_pair`` (its
  ``VLLMModel`` class, engine not started) against the prompt the adapters plan;
- the scores, on tiny models of each family with the same weights: lighteval's ``VLLMModel`` (its own
  encoding, truncation and reading of the scores, on the offline engine it shares with lm-eval's reference;
  `_lighteval_vllm` says what lets lighteval 0.13 run on vLLM 0.32) against `AsyncBackendsModel` on the
  ``vllm`` adapter: logprob and argmax_logits_eq_gold per choice. The engines are the package's
  (tests/parity/conftest.py), started once per family for both scoring modules.

Empty contexts are left out for the GPT-2 family: lighteval's model then scores the prompt's first token,
which has no logprob, and fails (a TypeError in its own code).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lighteval")
pytest.importorskip("vllm")

from lighteval.tasks.requests import Doc

from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

from ._split_references import lighteval_pair
from ._tokenizer_families import CASES, FAMILIES, build_tokenizer, planned

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
