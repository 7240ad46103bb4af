"""A prompt that does not fit the model, through each integration: one failed sample, the run goes on.

The mock's ``max_model_len`` (its tokens are characters) raises `ContextLengthError` as every adapter does;
inspect sees its ``model_length`` stop reason, lm-eval and lighteval a failed sample (an empty answer, a
``-inf`` score), never the error's text as an answer. Also: the integrations' timeout options.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.integrations._failed_samples import eval_timeouts

LONG = "a prompt far too long for this model " * 3  # 111 characters
SHORT = "fits"


def test_lm_eval_scores_a_too_long_request_as_a_failed_sample(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from asyncbackends.integrations.lm_eval import AsyncBackendsLM

    lm = AsyncBackendsLM("mock", progress=False, max_model_len=64, max_gen_toks=8)
    try:
        kwargs = {"until": ["\n"], "max_gen_toks": 8}
        generations = [Instance("generate_until", {}, (p, kwargs), i) for i, p in enumerate([SHORT, LONG])]
        with caplog.at_level(logging.WARNING):
            assert lm.generate_until(generations) == [SHORT, ""]
        assert "1 of 2 generate_until requests do not fit the model's context" in caplog.text
        scored = [
            Instance("loglikelihood", {}, args, i) for i, args in enumerate([("a", " b"), (LONG, " b")])
        ]
        (fits, _), (failed, failed_greedy) = lm.loglikelihood(scored)
        assert math.isfinite(fits) and failed == -math.inf and failed_greedy is False
        assert lm.backend.attempts[LONG] == 0  # refused before any attempt, and never retried
    finally:
        lm.close()


def test_lm_eval_still_stops_on_any_other_error() -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from asyncbackends.integrations.lm_eval import AsyncBackendsLM

    lm = AsyncBackendsLM("mock", progress=False, fail_attempts=5, failure="rejected", max_attempts=1)
    try:
        with pytest.raises(ab.RequestRejectedError, match="injected rejected failure"):
            lm.generate_until([Instance("generate_until", {}, ("x", {"max_gen_toks": 2}), 0)])
    finally:
        lm.close()


def test_lighteval_scores_a_too_long_request_as_a_failed_sample(tmp_path: Path) -> None:
    pytest.importorskip("lighteval")
    from lighteval.tasks.requests import Doc

    from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

    config = AsyncBackendsModelConfig(
        model_name="mock-echo", cache_dir=str(tmp_path / "cache"), progress=False,
        backend_options={"max_model_len": 64},
    )  # fmt: skip
    model = AsyncBackendsModel(config)
    try:
        docs = [
            Doc(query=query, choices=["x"], gold_index=0, task_name="t|0", generation_size=8, id=str(i))
            for i, query in enumerate([SHORT, LONG])
        ]
        fits, failed = model.greedy_until(docs)
        assert fits.text == [SHORT] and failed.text == [""]
        scored, too_long = model.loglikelihood(docs)
        # Below any real score, and finite: lighteval's sample cache keeps it (an infinity comes back None).
        assert math.isfinite(scored.logprobs[0]) and too_long.logprobs == [-1e30] < [scored.logprobs[0]]
        assert too_long.argmax_logits_eq_gold == [False]
    finally:
        model.cleanup()


def test_inspect_sees_the_model_length_stop_reason(tmp_path: Path) -> None:
    pytest.importorskip("inspect_ai")
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import get_model
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate

    model = get_model("asyncbackends/mock", memoize=False, max_model_len="64", latency="0")
    task = Task(dataset=[Sample(input=SHORT, target=SHORT), Sample(input=LONG, target=LONG)], solver=[generate()],
                scorer=includes())  # fmt: skip
    try:
        (log,) = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none", max_tokens=8)
    finally:
        import asyncio

        asyncio.run(model.__aexit__(None, None, None))
    assert log.status == "success" and log.samples is not None
    by_input = {sample.input: sample for sample in log.samples}
    fits, too_long = by_input[SHORT], by_input[LONG]
    assert fits.output.stop_reason == "max_tokens" and fits.output.completion == f"user: {SHORT}"[:8]
    assert too_long.error is None and too_long.output.stop_reason == "model_length"
    assert too_long.output.completion == ""  # the error is not an answer to grade
    assert "max_model_len=64" in (too_long.output.error or "")


@pytest.mark.parametrize(
    ("timeout", "idle", "expected"),
    [
        (None, None, ab.Timeouts(total=None, idle=120)),
        (300, None, ab.Timeouts(total=300, idle=120)),
        ("300", "30", ab.Timeouts(total=300, idle=30)),
        (None, 0, ab.Timeouts(total=None, idle=None)),
        ("None", "0", ab.Timeouts(total=None, idle=None)),
        ("None", "None", ab.Timeouts(total=None, idle=120)),  # None, however spelled, is the default
        (0, None, ab.Timeouts(total=None, idle=120)),  # 0 is no limit, for the total too
    ],
)
def test_integration_timeouts(timeout: Any, idle: Any, expected: ab.Timeouts) -> None:
    assert eval_timeouts(timeout, idle) == expected


def test_an_integration_timeout_that_is_not_a_number_is_named() -> None:
    with pytest.raises(ab.InvalidRequestError, match="idle_timeout must be a number of seconds >= 0"):
        eval_timeouts(None, "soon")
