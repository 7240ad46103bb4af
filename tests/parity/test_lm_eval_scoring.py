"""Scores through the lm-eval integration against lm-eval's own ``vllm`` model, token boundaries included.

lm-eval's ``_encode_pair`` decides which tokens are scored: the context's own tokens, then the whole text's
tokens beyond their count. Where a token crosses the boundary ("is 4" + "2.", " 42" one token) that is
"." after " 4", and a continuation that merged whole into the context scores nothing. Two layers:

- the tokens, with no engine, on every tokenizer family and case: lm-eval's own ``VLLM.loglikelihood``
  encoding (its class, engine not started; `_split_references`) against the prompt the adapters plan;
- the scores, on tiny models of each family with the same weights: lm-eval's ``VLLM`` (its engine) against
  `AsyncBackendsLM` on the ``vllm`` adapter: logprob, is_greedy and the number of scored tokens. The engines
  are the package's (tests/parity/conftest.py), started once per family for both scoring modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("vllm")

import asyncbackends as ab
from asyncbackends._text import EncodePairRequest
from asyncbackends.integrations.lm_eval import AsyncBackendsLM

from ._split_references import instances, lm_eval_pairs
from ._tokenizer_families import CASES, FAMILIES, build_tokenizer, planned

pytestmark = [
    # vLLM's engine shutdown leaves a ZMQ context for the garbage collector (reported to the adapter).
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.mark.parametrize("family", FAMILIES)
def test_planned_tokens_are_lm_eval_encode_pair(family: str) -> None:
    tokenizer = build_tokenizer(family)

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False).input_ids)

    merged = 0
    for (context, continuation), (want_context, want_continuation) in zip(
        CASES, lm_eval_pairs(tokenizer, CASES), strict=True
    ):
        got, scored = planned(family, tokenizer, context, continuation, "encode_pair")
        case = f"{family}: {context!r} + {continuation!r}"
        assert got == want_context + want_continuation, case
        assert scored == len(want_continuation), case
        merged += (
            context.rstrip() != ""
            and encode(context.rstrip())
            != encode(context.rstrip() + continuation)[: len(encode(context.rstrip()))]
        )
    assert merged >= 2  # the cases do cross the boundary in this family


LONG = ("The answer is 42. " * 580, "Yes!")
"""A context far beyond ``max_model_len`` (512): left-truncated, by lm-eval's vllm model and by the adapter."""


# -- the scores, with engines ------------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.slow
def test_scores_equal_lm_eval_vllm_model(
    family_model: tuple[str, Path], lm_eval_reference: Any, ours: Any
) -> None:
    family = family_model[0]
    cases = [*CASES, LONG]
    want = lm_eval_reference.loglikelihood(instances(cases), disable_tqdm=True)
    got = AsyncBackendsLM(ours, progress=False).loglikelihood(instances(cases))
    results = [
        r
        for r in ab.run_batch(ours, [EncodePairRequest(*c) for c in cases])
        if isinstance(r, ab.LoglikelihoodResult)
    ]
    assert len(lm_eval_reference.tok_encode(LONG[0])) > 2_800 > 4 * lm_eval_reference.max_length
    for case, (logprob, greedy), (ref_logprob, ref_greedy), result in zip(
        cases, got, want, results, strict=True
    ):
        label = f"{family}: {case}"
        assert logprob == pytest.approx(ref_logprob, abs=1e-4), label
        assert greedy == ref_greedy, label
        context, continuation = case
        if context:
            assert result.num_tokens == len(lm_eval_reference._encode_pair(context, continuation)[1]), label
        assert result.logprob == pytest.approx(ref_logprob, abs=1e-4), label
