"""Scoring through the engine's cheaper paths against vLLM's own ``prompt_logprobs`` on the same token ids.

The adapter asks for a one-token continuation with ``logprob_token_ids`` on the context (a question's choices
in one engine request) and for a longer one with ``prompt_logprobs`` reading the prefix cache; the reference
is ``prompt_logprobs`` over the whole prompt with the cache skipped (the adapter's former path, lm-eval's
way), on ids the test builds itself. Float32 on a CPU: within 1e-5; ``is_greedy`` exact.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters._scoring import ScoringPlan

from .test_scoring import _hf_pair

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

TOL = 1e-5
_SHARED = "Question: which city is the capital of France? The quick brown fox jumps over the lazy dog. " * 4


def _reference(backend: Any, ids: list[int], scored: int) -> tuple[float, bool, list[float]]:
    """vLLM's prompt logprobs over the whole prompt, the cache skipped."""
    plan = ScoringPlan(tuple(ids), scored)
    parts = ab.get_loop_manager().run(backend._scoring.score_prompt(plan, None))
    return sum(lp for lp, _ in parts), all(top for _, top in parts), [lp for lp, _ in parts]


def _check(backend: Any, tokenizer: Any, pairs: list[tuple[str, str]], results: list[Any]) -> None:
    for (context, continuation), got in zip(pairs, results, strict=True):
        ids, scored = _hf_pair(tokenizer, context, continuation)
        ids = ids[-(backend.max_model_len - 1) :]  # an over-long context loses its start
        logprob, greedy, parts = _reference(backend, ids, scored)
        assert got.num_tokens == scored, (context[-30:], continuation)
        assert got.token_logprobs == pytest.approx(parts, abs=TOL), (context[-30:], continuation)
        assert got.logprob == pytest.approx(logprob, abs=TOL)
        assert got.is_greedy is greedy


def _one_token(tokenizer: Any, context: str, candidates: list[str], count: int) -> list[str]:
    found = [c for c in candidates if _hf_pair(tokenizer, context, c)[1] == 1][:count]
    assert len(found) == count, f"too few one-token continuations among {candidates}"
    return found


def _greedy(backend: Any, ids: list[int], max_tokens: int) -> list[int]:
    params = ab.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    (result,) = ab.run_batch(backend, [ab.GenerationRequest(ids, params=params)])
    return list(result.completions[0].token_ids)


def test_one_token_choices_of_a_question_are_one_engine_request(backend: Any, hf_tokenizer: Any) -> None:
    context = _SHARED + "Answer:"
    choices = _one_token(hf_tokenizer, context, [" A", " B", " C", " D", " a", " b", " c", " d", " 1"], 4)
    groups, prompts = backend._scoring.groups.sent, backend._scoring.prompt_requests
    results = ab.run_batch(backend, [ab.LoglikelihoodRequest(context, c) for c in choices])
    assert backend._scoring.groups.sent - groups == 1
    assert backend._scoring.prompt_requests == prompts
    _check(backend, hf_tokenizer, [(context, c) for c in choices], results)


def test_a_lone_one_token_request_and_questions_interleaved(backend: Any, hf_tokenizer: Any) -> None:
    # Contexts no other test scores: a choice whose texts are all cached already resumes before the others
    # and is scored in a group of its own (exact still, but this test counts groups).
    contexts = ["The capital of France is", "Once upon a time, a fox", _SHARED + "Then the answer:"]
    pairs, lone = [], []
    for context in contexts:
        choices = _one_token(hf_tokenizer, context, [" a", " b", " c", " d", " t", " 1", " 2"], 4)
        pairs += [(context, c) for c in choices[:3]]
        lone.append((context, choices[3]))
    # Alone (its context is cached now; the choices below still need their whole texts encoded, so they resume
    # together).
    before = backend._scoring.groups.sent
    (alone,) = ab.run_batch(backend, [ab.LoglikelihoodRequest(*lone[0])])
    assert backend._scoring.groups.sent - before == 1
    _check(backend, hf_tokenizer, lone[:1], [alone])
    before = backend._scoring.groups.sent
    results = ab.run_batch(backend, [ab.LoglikelihoodRequest(c, x) for c, x in pairs])
    assert backend._scoring.groups.sent - before == len(contexts)
    _check(backend, hf_tokenizer, pairs, results)


def test_multi_token_merged_empty_and_truncated(backend: Any, hf_tokenizer: Any) -> None:
    long_context = "The quick brown fox jumps over the lazy dog. " * 60
    pairs = [
        (_SHARED + "Answer:", " the lazy dog"),
        (_SHARED + "Answer:", " Paris, the capital"),
        (_SHARED + "Answer:", " Paris is"),  # shares its first tokens with the one before
        ("The answer is 4", "2."),  # the continuation merges into the context's last token
        ("Paris is the capital of ", "France"),  # trailing space moves to the continuation
        ("", "Once upon a time"),  # empty context: BOS stands in
        ("", "g"),
        (long_context, " The answer is 42."),  # truncated from the left
        (long_context, " a"),
    ]
    merged = _hf_pair(hf_tokenizer, "The answer is 4", "2.")
    assert hf_tokenizer("The answer is 4").input_ids != merged[0][: -merged[1]], (
        "no merge across the boundary"
    )
    results = ab.run_batch(backend, [ab.LoglikelihoodRequest(c, x) for c, x in pairs])
    _check(backend, hf_tokenizer, pairs, results)
    # The same requests again: their prompts are in the prefix cache now, up to the last 128-token block.
    again = ab.run_batch(backend, [ab.LoglikelihoodRequest(c, x) for c, x in pairs])
    _check(backend, hf_tokenizer, pairs, again)


def test_a_cache_hit_reaching_the_continuation_is_sent_again(backend: Any, hf_tokenizer: Any) -> None:
    # A prompt of 300 tokens whose last 200 are scored: once cached, the hit (256 tokens) covers scored rows.
    ids = hf_tokenizer(_SHARED * 2).input_ids[:300]
    plan = ScoringPlan(tuple(ids), 200)
    reference = _reference(backend, ids, 200)[2]
    loop = ab.get_loop_manager()
    loop.run(backend._scoring.score(plan, None))
    before = backend._scoring.sent_again
    parts = loop.run(backend._scoring.score(plan, None))
    assert backend._scoring.sent_again == before + 1
    assert [lp for lp, _ in parts] == pytest.approx(reference, abs=TOL)


def test_is_greedy_true_for_the_models_own_tokens(backend: Any, hf_tokenizer: Any) -> None:
    context = hf_tokenizer(_SHARED + "Answer:").input_ids
    greedy = _greedy(backend, context, 4)
    other = greedy[0] + 1
    cases = [(greedy[:1], True), (greedy[:4], True), ([other], False), ([*greedy[:3], greedy[3] + 1], False)]
    loop = ab.get_loop_manager()
    for continuation, expected in cases:
        ids = context + continuation
        _, is_greedy, parts = _reference(backend, ids, len(continuation))
        assert is_greedy is expected  # the reference agrees with generation
        got = loop.run(backend._scoring.score(ScoringPlan(tuple(ids), len(continuation)), None))
        assert [lp for lp, _ in got] == pytest.approx(parts, abs=TOL)
        assert all(top for _, top in got) is is_greedy


def test_one_cancelled_choice_leaves_the_others_exact(backend: Any, hf_tokenizer: Any) -> None:
    context = hf_tokenizer(_SHARED + "Question two. Answer:").input_ids
    tokens = [5, 6, 7]

    async def run() -> list[tuple[float, bool]]:
        scoring = backend._scoring
        tasks = [asyncio.ensure_future(scoring.score(ScoringPlan((*context, t), 1), None)) for t in tokens]
        await asyncio.sleep(0)
        tasks[1].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[1], asyncio.CancelledError)
        return [done[0][0], done[2][0]]  # type: ignore[index]

    got = ab.get_loop_manager().run(run())
    for (logprob, top), token in zip(got, [5, 7], strict=True):
        reference, greedy, _ = _reference(backend, [*context, token], 1)
        assert logprob == pytest.approx(reference, abs=TOL) and top is greedy


def test_a_failed_group_fails_each_member_with_its_own_id(backend: Any, hf_tokenizer: Any) -> None:
    context = tuple(hf_tokenizer("A group that fails").input_ids)
    out_of_vocabulary = len(hf_tokenizer) + 1000

    async def run() -> list[Any]:
        scoring = backend._scoring
        plans = [ScoringPlan((*context, 5), 1), ScoringPlan((*context, out_of_vocabulary), 1)]
        return await asyncio.gather(
            *(scoring.score(p, f"r{i}") for i, p in enumerate(plans)), return_exceptions=True
        )

    results = ab.get_loop_manager().run(run())
    assert [type(r) for r in results] == [ab.RequestRejectedError, ab.RequestRejectedError]
    assert [r.request_id for r in results] == ["r0", "r1"]
    # The engine serves on.
    (ok,) = ab.run_batch(backend, [ab.LoglikelihoodRequest("A group that", " works")])
    assert ok.num_tokens >= 1
