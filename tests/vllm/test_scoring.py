"""Loglikelihoods on the real engine against transformers' log-softmax sums on the same weights."""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._text import EncodePairRequest

from ..parity._split_references import lighteval_pair, lm_eval_pairs
from ..transformers_reference import token_logprobs

# The first test to use the session engine also waits for its start-up (minutes on a busy 2-core machine).
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]


def _hf_score(hf_model: Any, token_ids: list[int], scored: int) -> tuple[float, bool, list[float]]:
    """Sum of the last ``scored`` tokens' logprobs, whether each was the argmax, and each one."""
    parts, greedy = token_logprobs(hf_model, token_ids, scored)
    return sum(parts), greedy, parts


def _hf_pair(hf_tokenizer: Any, context: str, continuation: str) -> tuple[list[int], int]:
    """(prompt, scored) of a plain request: lighteval's own split (a plain request splits as its models do)."""
    return lighteval_pair(hf_tokenizer, context, continuation)


def test_loglikelihood_matches_transformers(backend: Any, hf_model: Any, hf_tokenizer: Any) -> None:
    pairs = [
        ("The quick brown", " fox jumps"),
        ("Paris is the capital of ", "France"),  # trailing space moves to the continuation
        ("", "Once upon a time"),  # empty context: BOS stands in
        ("Question: What is two plus two? Answer:", " four."),
        ("The answer is 4", "2"),  # merges whole into the context's last token (" 42"): that token is scored
        # The model's own greedy next token (checked independently below, through transformers).
        ("Once upon a time", "g"),
        ("The answer is", ","),
    ]
    results = ab.run_batch(
        backend, [ab.LoglikelihoodRequest(c, x, request_id=str(i)) for i, (c, x) in enumerate(pairs)]
    )
    expected_greedy = []
    for (context, continuation), result in zip(pairs, results, strict=True):
        ids, scored = _hf_pair(hf_tokenizer, context, continuation)
        logprob, is_greedy, parts = _hf_score(hf_model, ids, scored)
        assert result.logprob == pytest.approx(logprob, abs=1e-3)
        assert result.num_tokens == scored
        assert result.token_logprobs == pytest.approx(parts, abs=1e-3)
        assert result.is_greedy is is_greedy
        expected_greedy.append(is_greedy)
    assert expected_greedy[-2:] == [True, True], "the model's own greedy continuation must score as greedy"
    assert not all(expected_greedy)


def test_lm_eval_split_matches_transformers_on_lm_evals_own_tokens(
    backend: Any, hf_model: Any, hf_tokenizer: Any
) -> None:
    pairs = [
        ("The answer is 4", "2."),  # " 42" merges across the boundary: "." is scored after " 4"
        ("Paris is the capital of ", "France"),
        ("", "Once upon a time"),
        ("Question: What is two plus two? Answer:", " four."),
    ]
    results = ab.run_batch(backend, [EncodePairRequest(c, x) for c, x in pairs])
    for (context_enc, continuation_enc), result in zip(
        lm_eval_pairs(hf_tokenizer, pairs), results, strict=True
    ):
        logprob, is_greedy, parts = _hf_score(hf_model, context_enc + continuation_enc, len(continuation_enc))
        assert result.num_tokens == len(continuation_enc)
        assert result.logprob == pytest.approx(logprob, abs=1e-3)
        assert result.token_logprobs == pytest.approx(parts, abs=1e-3)
        assert result.is_greedy is is_greedy


def test_overlong_context_is_truncated_from_the_left(backend: Any, hf_model: Any, hf_tokenizer: Any) -> None:
    context = "The quick brown fox jumps over the lazy dog. " * 60
    continuation = " The answer is 42."
    ids, scored = _hf_pair(hf_tokenizer, context, continuation)
    assert len(ids) > 511
    (result,) = ab.run_batch(backend, [ab.LoglikelihoodRequest(context, continuation)])
    logprob, _, _ = _hf_score(hf_model, ids[-511:], scored)  # the engine scores at most max_model_len - 1
    assert result.num_tokens == scored
    assert result.logprob == pytest.approx(logprob, abs=1e-3)


def test_continuation_longer_than_the_model_is_rejected(backend: Any) -> None:
    results = ab.run_batch(
        backend, [ab.LoglikelihoodRequest("Hi", "The quick brown fox. " * 200)], return_exceptions=True
    )
    assert isinstance(results[0], ab.RequestRejectedError)
    assert "max_model_len" in str(results[0])


def test_rolling_loglikelihood_one_window_matches_transformers(
    backend: Any, hf_model: Any, hf_tokenizer: Any
) -> None:
    text = "Once upon a time there was a small model that lived on a CPU."
    ids = hf_tokenizer(text, add_special_tokens=False).input_ids
    (result,) = ab.run_batch(backend, [ab.RollingLoglikelihoodRequest(text)])
    logprob, _, parts = _hf_score(hf_model, [hf_tokenizer.bos_token_id, *ids], len(ids))
    assert result.num_tokens == len(ids)
    assert result.logprob == pytest.approx(logprob, abs=1e-3)
    assert result.token_logprobs == pytest.approx(parts, abs=1e-3)


def test_rolling_loglikelihood_spans_windows(backend: Any, hf_model: Any, hf_tokenizer: Any) -> None:
    text = " ".join(f"Numbers: {i} {i + 1} {i + 2}." for i in range(120))
    ids = hf_tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) > 2 * 511, "the text must need three windows"
    (result,) = ab.run_batch(backend, [ab.RollingLoglikelihoodRequest(text)])
    assert result.num_tokens == len(ids)
    sequence = [hf_tokenizer.bos_token_id, *ids]
    # Window 1 scores tokens 1..510 of the sequence; window 2 the next 510, with the 511 tokens before each
    # as context; the last window the rest.
    expected = _hf_score(hf_model, sequence[:511], 510)[2]
    expected += _hf_score(hf_model, sequence[511 + 510 - 511 : 511 + 510], 510)[2]
    rest = len(sequence) - 1021
    expected += _hf_score(hf_model, sequence[len(sequence) - 511 :], rest)[2]
    assert result.token_logprobs == pytest.approx(expected, abs=1e-3)
    assert result.logprob == pytest.approx(sum(expected), abs=1e-2)


def test_batch_encoding_gives_the_ids_of_encode(backend: Any, hf_tokenizer: Any) -> None:
    # Scoring encodes through the tokenizer's batch call in a worker thread; its ids must be encode()'s.
    texts = [
        "The quick brown",
        " fox",
        "  two  spaces ",
        "naïve café ☕",
        "line\nbreak\n",
        "x" * 300,
        "2+2=4?",
    ]
    expected = [hf_tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert backend._loglikelihoods.encode_texts(texts) == expected


def test_concurrent_questions_score_as_each_alone(backend: Any) -> None:
    # Many questions' texts are encoded in shared batches (their contexts once): each answer must be the one
    # it gets when it is sent alone.
    contexts = ["Question: which is the largest?", "The capital of France is", "Once upon a time, a fox"]
    pairs = [(c, x) for c in contexts for x in (" Paris", " a tree", " the sea", " 42")]
    together = ab.run_batch(backend, [ab.LoglikelihoodRequest(c, x) for c, x in pairs])
    for (context, continuation), got in zip(pairs, together, strict=True):
        (alone,) = ab.run_batch(backend, [ab.LoglikelihoodRequest(context + " ", continuation.lstrip())])
        assert got.num_tokens == alone.num_tokens
        assert got.token_logprobs == pytest.approx(alone.token_logprobs, abs=1e-4)
