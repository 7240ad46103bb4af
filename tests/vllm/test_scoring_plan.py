"""The token arithmetic behind scoring, without an engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncbackends.adapters._scoring import (
    ScoringPlan,
    aplan_loglikelihood,
    plan_loglikelihood,
    plan_rolling,
    split_trailing_space,
    tail_logprobs,
)


def _chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def _merging(text: str) -> list[int]:
    # A tokenizer that merges "ab" into one token, so the pair boundary can fall inside a token.
    out, i = [], 0
    while i < len(text):
        if text.startswith("ab", i):
            out.append(1000)
            i += 2
        else:
            out.append(ord(text[i]))
            i += 1
    return out


def test_trailing_space_moves_to_the_continuation() -> None:
    assert split_trailing_space("Paris is ", "France") == ("Paris is", " France")
    assert split_trailing_space("x\n\n", "y") == ("x", "\n\ny")
    assert split_trailing_space("x", " y") == ("x", " y")


def test_plan_takes_the_tail_beyond_the_context() -> None:
    plan = plan_loglikelihood(
        "xa", "bc", encode=_merging, prefix=(7,), empty_context_token=9, max_prompt_tokens=100
    )
    assert plan is not None
    # "xabc" encodes as x, ab, c: the tail beyond the context's 3 tokens (7, x, a) is just c; the token
    # that crosses the boundary belongs to the context, as in lm-eval.
    assert plan.token_ids == (7, ord("x"), 1000, ord("c"))
    assert plan.scored == 1
    plan = plan_loglikelihood(
        "x", "abc", encode=_merging, prefix=(7,), empty_context_token=9, max_prompt_tokens=100
    )
    assert plan is not None and plan.token_ids == (7, ord("x"), 1000, ord("c")) and plan.scored == 2


def test_a_continuation_merged_into_the_context_by_split() -> None:
    # "xa" + "b": "xab" encodes as x, ab, as many tokens as the context (7, x, a).
    options: dict[str, Any] = {"encode": _merging, "prefix": (7,), "empty_context_token": 9}
    whole = plan_loglikelihood("xa", "b", max_prompt_tokens=100, **options)
    assert whole == ScoringPlan((7, ord("x"), 1000), 1)  # the merged token is scored (lighteval)
    pair = plan_loglikelihood("xa", "b", max_prompt_tokens=100, split="encode_pair", **options)
    assert pair == ScoringPlan((7, ord("x"), ord("a")), 0)  # nothing is (lm-eval's _encode_pair)
    crossing = plan_loglikelihood("xa", "bc", max_prompt_tokens=100, split="encode_pair", **options)
    assert crossing == ScoringPlan((7, ord("x"), ord("a"), ord("c")), 1)  # c after the context's own a


def test_empty_context_uses_the_stand_in_token() -> None:
    plan = plan_loglikelihood(
        "", "ab", encode=_chars, prefix=(7,), empty_context_token=9, max_prompt_tokens=100
    )
    assert plan is not None and plan.token_ids == (9, ord("a"), ord("b")) and plan.scored == 2


def test_long_context_is_cut_from_the_left_and_long_continuation_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="asyncbackends.adapters._scoring"):
        plan = plan_loglikelihood(
            "c" * 50, "xyz", encode=_chars, prefix=(), empty_context_token=9, max_prompt_tokens=10
        )
    assert plan is not None
    # Not silent: said as lm-eval's vllm model says it.
    assert [r.getMessage() for r in caplog.records] == [
        "context of 50 tokens left-truncated to fit the model's 7-token prompt: the first 43 dropped"
    ]
    assert plan.token_ids == (*_chars("c" * 7), *_chars("xyz")) and plan.scored == 3 and plan.truncated == 43
    assert (
        plan_loglikelihood(
            "c", "x" * 10, encode=_chars, prefix=(), empty_context_token=9, max_prompt_tokens=10
        )
        is None
    )


def _absorbing(text: str) -> list[int]:
    # Folds a trailing "b" into the token before it, so a continuation "b" can merge into the context.
    ids = _merging(text)
    return [*ids[:-2], ids[-2] + 5000] if text.endswith("b") and len(ids) > 1 else ids


@given(
    context=st.text("ab xyz", max_size=12),
    continuation=st.text("ab xyz", min_size=1, max_size=8),
    encode=st.sampled_from([_chars, _merging, _absorbing]),
    room=st.integers(2, 20),
    split=st.sampled_from(["whole", "encode_pair"]),
)
def test_async_plan_is_the_plan_and_asks_for_the_texts_together(
    context: str, continuation: str, encode: Callable[[str], list[int]], room: int, split: Any
) -> None:
    calls: list[list[str]] = []

    async def encode_many(texts: list[str]) -> list[list[int]]:
        calls.append(texts)
        return [encode(t) for t in texts]

    options: dict[str, Any] = {
        "prefix": (7,),
        "empty_context_token": 9,
        "max_prompt_tokens": room,
        "split": split,
    }
    expected = plan_loglikelihood(context, continuation, encode=encode, **options)
    got = asyncio.run(aplan_loglikelihood(context, continuation, encode=encode_many, **options))
    assert got == expected
    assert len(calls[0]) == (2 if context.rstrip() else 1)  # context and the whole: one call
    assert len(calls) == 1


@given(n=st.integers(1, 300), window=st.integers(2, 40))
def test_rolling_windows_score_every_token_once_with_full_context(n: int, window: int) -> None:
    tokens = list(range(100, 100 + n))
    plans = plan_rolling(tokens, prefix_token=1, max_prompt_tokens=window)
    scored = [t for p in plans for t in p.token_ids[len(p.token_ids) - p.scored :]]
    assert scored == tokens
    for p in plans:
        assert 1 <= p.scored < len(p.token_ids) <= window
    assert plans[0].token_ids[0] == 1
    for p in plans[1:]:
        assert len(p.token_ids) == window  # later windows are always full: maximal context


def test_rolling_needs_room_for_a_context_token() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        plan_rolling([1, 2], prefix_token=0, max_prompt_tokens=1)


def _flat(rows: list[dict[int, SimpleNamespace] | None]) -> SimpleNamespace:
    # The shape of vLLM's FlatLogprobs: every position's entries in flat lists, sliced by start/end indices.
    flat = SimpleNamespace(start_indices=[], end_indices=[], token_ids=[], logprobs=[], ranks=[])
    for row in rows:
        flat.start_indices.append(len(flat.token_ids))
        for token, entry in (row or {}).items():
            flat.token_ids.append(token)
            flat.logprobs.append(entry.logprob)
            flat.ranks.append(entry.rank)
        flat.end_indices.append(len(flat.token_ids))
    return flat


def test_tail_logprobs_reads_dict_rows_and_flat_rows_alike() -> None:
    plan = ScoringPlan((1, 2, 3, 4), scored=2)
    rows: list[dict[int, SimpleNamespace] | None] = [
        None,
        {2: SimpleNamespace(logprob=-9.0, rank=4)},
        {3: SimpleNamespace(logprob=-0.5, rank=1)},
        {4: SimpleNamespace(logprob=-1.5, rank=2), 7: SimpleNamespace(logprob=-0.1, rank=1)},
    ]
    assert tail_logprobs(rows, plan) == [(-0.5, True), (-1.5, False)]
    assert tail_logprobs(_flat(rows), plan) == [(-0.5, True), (-1.5, False)]
    missing = [*rows[:3], {7: SimpleNamespace(logprob=-0.1, rank=1)}]
    assert tail_logprobs(missing, plan) is None
    assert tail_logprobs(_flat(missing), plan) is None


def _lp(logprob: float, rank: int) -> SimpleNamespace:
    return SimpleNamespace(logprob=logprob, rank=rank)


def test_tail_logprobs_reads_rows_that_leave_out_the_first_ones() -> None:
    # vLLM 0.26 on a GPU gave fewer rows than prompt tokens (no row for the first token): the rows are the
    # prompt's last ones, and a row read at the wrong place is a miss, never a wrong value.
    plan = ScoringPlan(token_ids=(1, 2, 3, 4), scored=2)
    rows: list[dict[int, SimpleNamespace] | None] = [
        None,
        {2: _lp(-0.1, 1)},
        {3: _lp(-0.5, 1)},
        {4: _lp(-1.5, 2)},
    ]
    for shorter in (rows[1:], rows[2:]):
        assert tail_logprobs(shorter, plan) == [(-0.5, True), (-1.5, False)]
        assert tail_logprobs(_flat(shorter), plan) == [(-0.5, True), (-1.5, False)]
    assert tail_logprobs(rows[3:], plan) is None  # a scored row is not there
    shifted: list[dict[int, SimpleNamespace] | None] = [
        {3: _lp(-0.5, 1)},
        {9: _lp(-1.5, 2)},
    ]  # tail-aligned, but not the prompt's tokens
    assert tail_logprobs(shifted, plan) is None
