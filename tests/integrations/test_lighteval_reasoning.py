"""lighteval on reasoning models (the mock that thinks): its reasoning tags, the answer alone scored.

The local task ``ab_think`` (tests/data/lighteval_tasks) asks short questions, whose thought closes within its
32 tokens, and long ones, cut off while thinking, which must score as empty answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lighteval")

from lighteval.utils.utils import remove_reasoning_tags

import asyncbackends as ab
from asyncbackends.integrations._thinking import answer_without_tags
from asyncbackends.integrations.lighteval import AsyncBackendsModelConfig

from .lighteval_helpers import custom_tasks_only, details, run_pipeline

SHORT = ("two", "red", "fox")
THINK = [("<think>", "</think>")]


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **fields: Any) -> tuple[dict[str, str], float]:
    custom_tasks_only(monkeypatch)
    config = AsyncBackendsModelConfig(
        model_name="mock-thinking", cache_dir=str(tmp_path / "cache"), progress=False, **fields
    )
    pipeline = run_pipeline("ab_think|0", tmp_path / "out", model_config=config)
    answers = {
        doc.query.split("\n")[0]: response.final_text[0] for doc, response in details(pipeline, "ab_think|0")
    }
    return answers, pipeline.get_results()["results"]["ab_think:0"]["em"]


@pytest.mark.parametrize(
    "fields",
    [
        {"backend_options": {"thinking": "split"}},  # the backend splits: its text is the answer
        # The thinking in the text, closed by </think> (the template opened it): removed by the tags here.
        {"backend_options": {"thinking": "inline"}, "reasoning_tags": "[('<think>', '</think>')]"},
    ],
)
def test_the_answer_alone_is_scored_and_unfinished_thoughts_are_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any]
) -> None:
    answers, score = _run(tmp_path, monkeypatch, backend="mock", **fields)
    assert len(answers) == 5
    for question, answer in answers.items():
        assert answer == (question if question in SHORT else "")
    assert score == pytest.approx(3 / 5)


def test_lightevals_own_tag_removal_misses_a_thought_the_template_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The contrast: no tags here, so lighteval's pipeline removes <think>...</think> pairs itself; a thought
    # opened by the prompt has no <think> in the text, and the task's "\n" cut it inside the thought.
    answers, score = _run(tmp_path, monkeypatch, backend="mock", backend_options={"thinking": "inline"})
    assert answers["two"] == ":A"  # "two\nA:" thought backwards, cut at its "\n"
    assert score == 0.0


@pytest.mark.parametrize(
    "text",
    ["<think>a</think>b", "x<think>a</think>b<think>c</think>d", "<think>\n\n</think>\n\nb"],
)
def test_closed_pairs_are_removed_as_lighteval_removes_them(text: str) -> None:
    assert answer_without_tags(ab.Completion(text), THINK).text == remove_reasoning_tags(text, THINK)


@pytest.mark.parametrize(
    ("text", "answer", "unclosed"),
    [
        ("thought opened by the template</think>b", "b", False),
        ("<think>still thinking when the limit came", "", True),
        ("a thought the template opened, cut off by the limit", "", True),
        ("a</think>b<think>c", "", True),
        ("[r]x[/r]y<think>z</think>w", "yw", False),
    ],
)
def test_the_cases_lighteval_misses(text: str, answer: str, unclosed: bool) -> None:
    got = answer_without_tags(ab.Completion(text), [*THINK, ("[r]", "[/r]")])
    assert (got.text, got.unclosed) == (answer, unclosed)


def test_a_backend_that_splits_gives_its_answer() -> None:
    completion = ab.Completion("", reasoning="<think> half", reasoning_truncated=True)
    assert answer_without_tags(completion, THINK).unclosed
    assert answer_without_tags(ab.Completion("b", reasoning="a</think>"), THINK).text == "b"


@pytest.mark.parametrize("tags", ["nonsense(", "[('<think>', '')]", [("<think>",)], "[]"])
def test_bad_reasoning_tags_are_refused(tags: Any) -> None:
    with pytest.raises(ValueError, match="reasoning_tags"):  # our InvalidRequestError, in pydantic's error
        AsyncBackendsModelConfig(model_name="m", reasoning_tags=tags)
