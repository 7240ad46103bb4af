"""lm-eval on reasoning models (the mock that thinks): the answer alone scored, unfinished thoughts wrong.

The local task ``ab_think`` asks short and long questions with ``max_gen_toks=32``: the mock thinks each
prompt backwards before echoing it, so a short question's thought closes and its answer is right, and a long
one's thought is cut off by the token limit and must score as an empty answer.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance
from lm_eval.models.utils import postprocess_generated_text

import asyncbackends as ab
from asyncbackends.integrations.lm_eval import AsyncBackendsLM

LM_EVAL_TASKS = Path(__file__).resolve().parent.parent / "data" / "lm_eval_tasks"
SHORT = ("two", "red", "fox")


def _evaluate(model_args: str) -> dict[str, Any]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="asyncbackends",
        model_args=model_args,
        tasks=["ab_think"],
        task_manager=TaskManager(include_path=str(LM_EVAL_TASKS), include_defaults=False),
        log_samples=True,
    )
    assert results is not None
    return results


def _answers(results: dict[str, Any]) -> dict[str, str]:
    return {s["doc"]["question"]: s["filtered_resps"][0] for s in results["samples"]["ab_think"]}


@pytest.mark.parametrize(
    "model_args",
    [
        "backend=mock,thinking=split,progress=False",  # the backend splits: its text is the answer
        "backend=mock,thinking=inline,think_end_token=</think>,progress=False",  # split here
    ],
)
def test_the_answer_alone_is_scored_and_unfinished_thoughts_are_wrong(model_args: str) -> None:
    results = _evaluate(model_args)
    answers = _answers(results)
    assert len(answers) == 5
    for question, answer in answers.items():
        # Short: the thought closed and the echo, cut at the task's "\n", is the answer. Long: cut off while
        # thinking, an empty answer, never the thought.
        assert answer == (question if question in SHORT else "")
    assert results["results"]["ab_think"]["exact_match,none"] == pytest.approx(3 / 5)


def test_without_the_split_the_thought_is_scored() -> None:
    # The contrast: a plain backend and no think_end_token scores the thought, and the task's "\n" stop,
    # sent to a backend that does not know thinking, cuts inside the thought.
    answers = _answers(_evaluate("backend=mock,thinking=inline,progress=False"))
    assert answers["two"] == ":A"  # the thought "two\nA:" backwards, cut at its "\n"
    assert not any(answers[q] == q for q in SHORT)


def test_lm_evals_own_split_scores_an_unfinished_thought_where_ours_scores_nothing() -> None:
    lm = AsyncBackendsLM("mock", thinking="inline", think_end_token="</think>", progress=False)
    try:
        prompt = "Name the longest river on the planet\nA:"
        raw = ab.run_batch(lm.backend, [ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=32))])[
            0
        ].text
        assert "</think>" not in raw  # the limit came while thinking
        theirs = postprocess_generated_text(raw, ["\n"], "</think>")
        assert theirs == raw.split("\n")[0] != ""  # lm-eval's models score the thought as the answer
        ours = lm.generate_until(
            [Instance("generate_until", {}, (prompt, {"until": ["\n"], "max_gen_toks": 32}), 0)]
        )
        assert ours == [""]
    finally:
        lm.close()


def test_unfinished_thoughts_are_counted_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    lm = AsyncBackendsLM("mock", thinking="split", progress=False)
    try:
        args = [(q + "\nA:", {"until": ["\n"], "max_gen_toks": 12}) for q in ("a", "a long question")]
        with caplog.at_level(logging.WARNING, logger="asyncbackends.integrations.lm_eval"):
            assert lm.generate_until([Instance("generate_until", {}, a, i) for i, a in enumerate(args)]) == [
                "a",
                "",
            ]
        assert "1 of 2 generations were cut off while thinking" in caplog.text
    finally:
        lm.close()


def test_think_end_token_must_be_text() -> None:
    with pytest.raises(ab.InvalidRequestError, match="think_end_token"):
        AsyncBackendsLM("mock", think_end_token=151668)  # type: ignore[arg-type]


@pytest.mark.parametrize("chat", [False, True], ids=["text", "chat"])
def test_a_text_prompts_stops_apply_after_the_split_on_a_backend_that_splits_chats_only(chat: bool) -> None:
    """The vllm adapter (as vllm serve) splits the thinking of chats only: a text prompt's answer-level stop
    would end the thought, so for a text prompt the stops are applied after ``think_end_token``'s split."""
    backend = ab.create_backend("mock", thinking="split")
    assert backend.capabilities.reasoning
    sent: list[ab.GenerationRequest] = []
    generate = backend.generate

    async def recorded(request: ab.GenerationRequest) -> ab.GenerationResult:
        sent.append(request)
        return await generate(request)

    backend.generate = recorded  # type: ignore[method-assign]
    lm = AsyncBackendsLM(backend, think_end_token="</think>", progress=False)
    context = lm.apply_chat_template([{"role": "user", "content": "two"}]) if chat else "two"
    lm.generate_until([Instance("generate_until", {}, (context, {"until": ["\n\n"], "max_gen_toks": 8}), 0)])
    assert [r.params.stop for r in sent] == [("\n\n",) if chat else ()]
