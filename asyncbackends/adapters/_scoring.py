"""Token arithmetic for scoring, shared by the vllm, openai and tgi adapters (no engine, no vLLM import).

Scoring works on token ids, never on strings: the context and context+continuation are encoded separately
and the continuation's tokens are the tail of the whole encoding beyond the context's token count. Which
prompt that tail is scored after, where a token crosses the boundary, is the request's `Split`: the whole
text's tokens (a plain request; lighteval's models) or the context's own tokens (lm-eval's ``_encode_pair``).
vLLM then returns each prompt token's logprob and rank given the tokens before it (``prompt_logprobs=0``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._text import Split
from .._text import split_trailing_space as split_trailing_space
from .._types import LoglikelihoodResult

__all__ = [
    "ScoringPlan",
    "Tokenizer",
    "TextsEncoder",
    "aplan_loglikelihood",
    "logprob_of",
    "plan_loglikelihood",
    "plan_rolling",
    "scored_result",
    "tail_logprobs",
]

Tokenizer = Callable[[str], list[int]]
"""Encodes text to token ids without special tokens."""

log = logging.getLogger(__name__)

TextsEncoder = Callable[[list[str]], Awaitable[list[list[int]]]]
"""Encodes texts to token ids without special tokens, one list per text, in order (a tokenizer route, a worker
thread)."""


@dataclass(frozen=True, slots=True)
class ScoringPlan:
    """One engine prompt and how many of its last tokens are scored.

    Attributes:
        token_ids: The prompt sent to the engine (at least ``scored + 1`` tokens).
        scored: How many trailing tokens of ``token_ids`` are summed.
        truncated: How many leading context tokens were dropped to fit the model.
    """

    token_ids: tuple[int, ...]
    scored: int
    truncated: int = 0


def plan_loglikelihood(
    context: str,
    continuation: str,
    *,
    encode: Tokenizer,
    prefix: Sequence[int],
    empty_context_token: int,
    max_prompt_tokens: int,
    split: Split = "whole",
) -> ScoringPlan | None:
    """Plan the prompt that scores ``continuation`` after ``context``.

    Args:
        context: Conditioning text; empty means the model's BOS (or EOS) token alone.
        continuation: Text to score (not empty).
        encode: The engine tokenizer, without special tokens.
        prefix: Special tokens the tokenizer puts in front of every text (``[bos]`` for Llama-like ones).
        empty_context_token: The token that stands in for an empty context.
        max_prompt_tokens: The longest prompt the engine scores (``max_model_len - 1``).
        split: Which tokens are scored where a token crosses the boundary (`Split`).

    Returns:
        The plan (``scored`` may be 0: a continuation that merged into the context under ``"encode_pair"``
        scores nothing, as in lm-eval), or ``None`` when the continuation alone does not fit (it cannot be
        scored whole). An over-long context is truncated from the left (with a warning), as lm-eval's vllm
        model does: the prompt is the last ``max_prompt_tokens`` tokens.
    """
    context, continuation = split_trailing_space(context, continuation)
    if context:
        context_ids = [*prefix, *encode(context)]
        whole = [*prefix, *encode(context + continuation)]
        cut = len(context_ids)
        if split == "encode_pair":
            tokens = context_ids + whole[cut:]
        else:
            tokens = whole
            if cut == len(whole):  # merged whole into the context's last token: that token is scored
                cut -= 1
    else:
        continuation_ids = encode(continuation)
        if split == "encode_pair" and continuation_ids[:1] == [empty_context_token]:
            tokens = continuation_ids  # lm-eval: the text's own first token conditions the rest
        else:
            tokens = [empty_context_token, *continuation_ids]
        cut = 1
    if cut < 1:  # nothing left before the scored tokens: the stand-in conditions them
        tokens, cut = [empty_context_token, *tokens], 1
    scored = max(0, len(tokens) - cut)
    if scored + 1 > max_prompt_tokens:
        return None
    truncated = max(0, len(tokens) - max_prompt_tokens)
    if truncated:  # lm-eval's vllm model warns too, and truncates the same tokens
        log.warning(
            "context of %d tokens left-truncated to fit the model's %d-token prompt: the first %d dropped",
            len(tokens) - scored, max_prompt_tokens - scored, truncated,
        )  # fmt: skip
    return ScoringPlan(tuple(tokens[truncated:]), scored, truncated)


async def aplan_loglikelihood(
    context: str,
    continuation: str,
    *,
    encode: TextsEncoder,
    prefix: Sequence[int],
    empty_context_token: int,
    max_prompt_tokens: int,
    split: Split = "whole",
) -> ScoringPlan | None:
    """`plan_loglikelihood` with an asynchronous encoder: the texts it needs are encoded in one call.

    Arguments and result as `plan_loglikelihood`'s.
    """
    context, continuation = split_trailing_space(context, continuation)
    texts = [context, context + continuation] if context else [continuation]
    encoded = dict(zip(texts, await encode(texts), strict=True))
    return plan_loglikelihood(
        context,
        continuation,
        encode=encoded.__getitem__,
        prefix=prefix,
        empty_context_token=empty_context_token,
        max_prompt_tokens=max_prompt_tokens,
        split=split,
    )


def plan_rolling(token_ids: Sequence[int], *, prefix_token: int, max_prompt_tokens: int) -> list[ScoringPlan]:
    """Split a whole text into windows that score every token exactly once (lm-eval's rolling windows).

    The first window starts with ``prefix_token`` so the text's first token is scored too; each later
    window scores the next ``max_prompt_tokens - 1`` tokens at most and fills the rest of the model's length
    with the tokens just before them as context, so every token is scored with as much context as fits.

    Args:
        token_ids: The text's tokens, without special tokens.
        prefix_token: The BOS (or EOS) token that conditions the first token.
        max_prompt_tokens: The longest prompt the engine scores (at least 2).
    """
    if max_prompt_tokens < 2:
        raise ValueError("max_prompt_tokens must be at least 2")
    sequence = [prefix_token, *token_ids]
    plans = []
    done = 1  # position 0 is the prefix: never scored
    while done < len(sequence):
        end = min(len(sequence), done + max_prompt_tokens - 1)
        start = max(0, end - max_prompt_tokens)
        plans.append(ScoringPlan(tuple(sequence[start:end]), end - done))
        done = end
    return plans


def logprob_of(step: Mapping[int, Any] | None, token: int) -> float:
    """The logprob vLLM reported for ``token`` at one step (NaN where it reported none)."""
    entry = step.get(token) if step is not None else None
    return float(entry.logprob) if entry is not None else float("nan")


def tail_logprobs(rows: Any, plan: ScoringPlan) -> list[tuple[float, bool]] | None:
    """The (logprob, is it the top-1 token) of the plan's scored tokens, from vLLM's prompt logprobs.

    ``rows`` holds one entry per prompt token: a ``{token: Logprob}`` dict (``None`` for the first), or
    vLLM's ``FlatLogprobs``, read through its flat lists so no dict is built per position. Fewer rows than
    prompt tokens are the prompt's last ones (vLLM versions differ: some leave out the first token's row, or
    the rows a prefix-cache hit covered). ``None`` when a scored token is missing; each row is checked to
    hold its own prompt token, so rows read at the wrong place are a miss, never a wrong value.
    """
    first = len(plan.token_ids) - plan.scored
    starts = getattr(rows, "start_indices", None)
    offset = len(plan.token_ids) - len(rows if starts is None else starts)
    if offset < 0 or first < offset:
        return None
    if starts is None:
        scored = []
        for token, row in zip(plan.token_ids[first:], rows[first - offset :], strict=True):
            entry = row.get(token) if row is not None else None
            if entry is None:
                return None
            scored.append((float(entry.logprob), entry.rank == 1))
        return scored
    ends, tokens, logprobs, ranks = rows.end_indices, rows.token_ids, rows.logprobs, rows.ranks
    flat = []
    for position in range(first, len(plan.token_ids)):
        token = plan.token_ids[position]
        row = position - offset
        found = [i for i in range(starts[row], ends[row]) if tokens[i] == token]
        if not found:
            return None
        flat.append((float(logprobs[found[0]]), ranks[found[0]] == 1))
    return flat


def scored_result(request_id: str | None, scored: Sequence[tuple[float, bool]]) -> LoglikelihoodResult:
    """Sum the scored tokens' (logprob, is it the top-1 token); greedy when every one was the top-1 token."""
    logprobs = tuple(lp for lp, _ in scored)
    return LoglikelihoodResult(
        request_id,
        sum(logprobs),
        is_greedy=all(top for _, top in scored),
        num_tokens=len(scored),
        token_logprobs=logprobs,
    )
