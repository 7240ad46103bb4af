"""The mock as a reasoning model (option ``thinking``): the thought, its cost, effort, budget and cut-offs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab

PROMPT = "Q: two and two?\nA:"
THOUGHT = PROMPT[::-1]  # the mock thinks its prompt backwards


def _one(backend: Any, prompt: str = PROMPT, **params: Any) -> ab.Completion:
    result = ab.run_batch(backend, [ab.GenerationRequest(prompt, ab.SamplingParams(**params))])[0]
    return result.completions[0]


def test_split_thinks_then_answers_and_counts_the_thought(make_mock: Any) -> None:
    completion = _one(make_mock(thinking="split"), max_tokens=100, logprobs=True)
    assert (completion.reasoning, completion.text) == (THOUGHT, PROMPT)
    assert completion.reasoning_tokens == len(THOUGHT)
    assert not completion.reasoning_truncated and completion.finish_reason == "stop"
    # Every generated token, the thought's first, as an engine reports them.
    assert completion.token_ids == tuple(map(ord, THOUGHT + PROMPT))
    assert completion.logprobs is not None and len(completion.logprobs) == len(completion.token_ids)


def test_max_tokens_counts_the_thought(make_mock: Any) -> None:
    backend = make_mock(thinking="split")
    room = len(THOUGHT) + 4
    completion = _one(backend, max_tokens=room)
    assert (completion.text, completion.finish_reason) == (PROMPT[:4], "length")
    cut = _one(backend, max_tokens=len(THOUGHT) - 1)
    assert cut.reasoning_truncated and cut.text == "" and cut.finish_reason == "length"
    assert cut.reasoning == THOUGHT[:-1] and cut.reasoning_tokens == len(THOUGHT) - 1


def test_stop_strings_end_the_answer_not_the_thought(make_mock: Any) -> None:
    assert "\n" in THOUGHT
    completion = _one(make_mock(thinking="split"), max_tokens=100, stop=("\n",))
    assert (completion.reasoning, completion.text) == (THOUGHT, "Q: two and two?")


@pytest.mark.parametrize(
    ("effort", "length"),
    [("none", 0), ("minimal", 5), ("low", 9), ("medium", 18), ("high", 36), (None, 18)],
)
def test_effort_scales_the_thought(make_mock: Any, effort: str | None, length: int) -> None:
    assert len(PROMPT) == 18
    completion = _one(make_mock(thinking="split"), max_tokens=200, reasoning_effort=effort)
    assert completion.reasoning == (THOUGHT * 2)[:length]
    assert completion.text == PROMPT


@pytest.mark.parametrize("budget", [0, 1, 7, 100])
def test_the_budget_caps_the_thought_and_the_answer_follows(make_mock: Any, budget: int) -> None:
    completion = _one(
        make_mock(thinking="split"), max_tokens=200, thinking_budget=budget, reasoning_effort="high"
    )
    assert completion.reasoning_tokens == min(budget, 2 * len(PROMPT))
    assert completion.text == PROMPT and not completion.reasoning_truncated


def test_inline_returns_the_thought_in_the_text_and_stops_cut_it(make_mock: Any) -> None:
    backend = make_mock(thinking="inline")
    assert not backend.capabilities.reasoning and backend.capabilities.thinking_budget
    completion = _one(backend, max_tokens=100)
    assert completion.reasoning is None and completion.text == THOUGHT + "</think>" + PROMPT
    # A server without a reasoning parser applies stops to everything: the "\n" inside the thought cuts it.
    assert _one(backend, max_tokens=100, stop=("\n",)).text == THOUGHT.split("\n")[0]
    # Cut off while thinking: the open thought is the text (what a plain server returns).
    assert _one(backend, max_tokens=5).text == THOUGHT[:5]


def test_a_mock_that_does_not_think_refuses_reasoning_params(make_mock: Any) -> None:
    backend = make_mock()
    for name, value in (("reasoning_effort", "low"), ("thinking_budget", 4)):
        with pytest.raises(ab.RequestRejectedError, match=name):
            _one(backend, **{name: value})
    with pytest.raises(ab.InvalidRequestError, match="thinking"):
        make_mock(thinking="sometimes")


@pytest.mark.parametrize("mode", ["split", "inline"])
def test_a_cache_filled_by_a_plain_mock_is_a_miss_for_a_thinking_one(
    make_mock: Any, tmp_path: Path, mode: str
) -> None:
    path = tmp_path / "cache.sqlite"
    request = ab.GenerationRequest(PROMPT, ab.SamplingParams(max_tokens=100))
    (plain,) = ab.run_batch(make_mock(), [request], cache=path)
    assert plain.text == PROMPT
    thinker = make_mock(thinking=mode)
    (thought,) = ab.run_batch(thinker, [request], cache=path)
    assert thinker.completed == 1  # asked, not served the plain mock's answer
    assert THOUGHT in (thought.completions[0].reasoning or thought.text)
    # Its own answers are cached under its own identity: the same mode reads them back.
    again = make_mock(thinking=mode)
    assert ab.run_batch(again, [request], cache=path) == [thought] and again.completed == 0
