"""End to end: lm-eval's own evaluator on local tasks, through the vllm adapter, checked against lm-eval's `hf`.

Both run the same tiny random-weight Llama (float32), so every per-sample loglikelihood must agree within
1e-3, every greedy generation must be identical, and so must the metrics.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

import lm_eval
from lm_eval.tasks import TaskManager

from asyncbackends.integrations.lm_eval import AsyncBackendsLM

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    # vLLM's engine shutdown leaves a ZMQ context for the garbage collector (reported to the adapter).
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

LM_EVAL_TASKS = Path(__file__).resolve().parent.parent / "data" / "lm_eval_tasks"
TASKS = ["ab_mc", "ab_gen", "ab_ppl"]


def _evaluate(model: Any, tasks: list[str], model_args: str | None = None) -> dict[str, Any]:
    results = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        task_manager=TaskManager(include_path=str(LM_EVAL_TASKS), include_defaults=False),
        log_samples=True,
        device="cpu",
    )
    assert results is not None
    return results


def _by_doc(results: dict[str, Any], task: str) -> list[Any]:
    return [s["filtered_resps"] for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])]


@pytest.fixture(scope="module")
def ours(vllm_backend: Any) -> dict[str, Any]:
    # The session's engine is shared with other tests: wrap it, never close it here.
    return _evaluate(AsyncBackendsLM(vllm_backend, progress=False), TASKS)


@pytest.fixture(scope="module")
def reference(tiny_model_path: Path) -> dict[str, Any]:
    args = f"pretrained={tiny_model_path},dtype=float32"
    scored = _evaluate("hf", ["ab_mc", "ab_gen"], args)
    # lm-eval's models encode a rolling text with the tokenizer's special tokens, so with a BOS-adding
    # tokenizer they also score BOS given BOS; the vllm adapter scores the text's own tokens only, which is
    # what lm-eval's hf does with add_bos_token=False (its loglikelihood and generation would then drop BOS).
    rolling = _evaluate("hf", ["ab_ppl"], args + ",add_bos_token=False")
    scored["samples"].update(rolling["samples"])
    scored["results"].update(rolling["results"])
    return scored


def test_multiple_choice_loglikelihoods_match_hf(ours: dict[str, Any], reference: dict[str, Any]) -> None:
    got, want = _by_doc(ours, "ab_mc"), _by_doc(reference, "ab_mc")
    assert len(got) == len(want) == 12
    for doc, (ours_doc, ref_doc) in enumerate(zip(got, want, strict=True)):
        assert len(ours_doc) == len(ref_doc)
        for (logprob, greedy), (ref_logprob, ref_greedy) in zip(ours_doc, ref_doc, strict=True):
            assert logprob == pytest.approx(ref_logprob, abs=1e-3), f"doc {doc}"
            assert greedy == ref_greedy, f"doc {doc}"
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"]["ab_mc"][metric] == reference["results"]["ab_mc"][metric]


def test_greedy_generations_match_hf(ours: dict[str, Any], reference: dict[str, Any]) -> None:
    got, want = _by_doc(ours, "ab_gen"), _by_doc(reference, "ab_gen")
    assert len(got) == 10
    assert got == want
    assert any(text[0] for text in got)  # not trivially equal: the model does write something
    assert ours["results"]["ab_gen"]["exact_match,none"] == reference["results"]["ab_gen"]["exact_match,none"]


def test_perplexity_matches_hf(ours: dict[str, Any], reference: dict[str, Any]) -> None:
    got, want = _by_doc(ours, "ab_ppl"), _by_doc(reference, "ab_ppl")
    assert len(got) == 10
    for ours_doc, ref_doc in zip(got, want, strict=True):
        ours_ll = ours_doc[0] if isinstance(ours_doc, (list, tuple)) else ours_doc
        ref_ll = ref_doc[0] if isinstance(ref_doc, (list, tuple)) else ref_doc
        assert ours_ll == pytest.approx(ref_ll, abs=1e-3)
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        value, ref = ours["results"]["ab_ppl"][metric], reference["results"]["ab_ppl"][metric]
        assert math.isfinite(value)
        assert value == pytest.approx(ref, rel=1e-4)
