r"""Thinking split from the answer by tags, for servers that return one text (``tgi``, ``endpoints``).

With the adapter option ``reasoning_tags=(start, end)`` (``("<think>", "</think>")`` for DeepSeek-R1 and
Qwen3) a completion's text is split as vLLM's ``deepseek_r1`` parser splits it: what comes before a first
``start`` is dropped, what comes before the first ``end`` is the thinking (with or without ``start``: chat
templates that open the thought in the prompt leave it out of the output), what follows is the answer. With
no ``end`` at all the whole text is thinking and there is no answer; cut off so (``"length"``) it is
`Completion.reasoning_truncated`. The server must keep the tags in its text (they are added tokens, not
special ones, in R1's and Qwen3's tokenizers).

Stop strings end only the answer: they are not sent to the server (which would cut a thought at its first
blank line, given "\n\n"), and the answer is cut at the stop string that completes earliest in it, as vLLM
cuts its text (ties by order), with finish reason ``"stop"``. The server then generates up to
``max_tokens``; a request that also asks for logprobs is refused, since the tokens of the cut text are not
known.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .._types import Completion, GenerationRequest
from ..errors import InvalidRequestError, RequestRejectedError

__all__ = ["check_reasoning_tags", "earliest_stop", "split_by_tags", "without_stops"]


def check_reasoning_tags(tags: object) -> tuple[str, str] | None:
    """``tags`` as a (start, end) pair, or ``None`` for none.

    Raises:
        InvalidRequestError: ``tags`` is not ``None`` nor a pair of non-empty strings.
    """
    if tags is None:
        return None
    if (
        not isinstance(tags, (tuple, list))
        or len(tags) != 2
        or not all(isinstance(tag, str) and tag for tag in tags)
    ):
        raise InvalidRequestError(
            "reasoning_tags must be a pair of non-empty strings (start, end), e.g. ('<think>', '</think>'); "
            f"got {tags!r}"
        )
    return tags[0], tags[1]


def without_stops(request: GenerationRequest, backend: str) -> GenerationRequest:
    """``request`` with no stop strings (applied to the answer afterwards by `split_by_tags`).

    Raises:
        RequestRejectedError: It asks for logprobs too.
    """
    params = request.params
    if not params.stop:
        return request
    if params.logprobs:
        raise RequestRejectedError(
            f"{backend}: with reasoning_tags, stop strings are applied to the answer here, not by the "
            "server, so the logprobs of the text kept are not known; ask for logprobs or stop, not both",
            backend=backend,
            request_id=request.request_id,
        )
    return dataclasses.replace(request, params=dataclasses.replace(params, stop=()))


def split_by_tags(completion: Completion, tags: tuple[str, str], stops: Sequence[str]) -> Completion:
    """``completion`` with its thinking in ``reasoning`` and its answer, cut at ``stops``, in ``text``."""
    start, end = tags
    text = completion.text
    before, opened, after = text.partition(start)
    body = after if opened else before
    reasoning, closed, answer = body.partition(end)
    if not closed:
        truncated = completion.finish_reason == "length"
        return dataclasses.replace(completion, text="", reasoning=reasoning, reasoning_truncated=truncated)
    finish = completion.finish_reason
    cut = earliest_stop(answer, stops)
    if cut is not None:
        answer, finish = answer[: cut[0]], "stop"
    return dataclasses.replace(completion, text=answer, reasoning=reasoning, finish_reason=finish)


def earliest_stop(text: str, stops: Sequence[str], after: int = 0) -> tuple[int, int] | None:
    """(start, end) of the stop string that completes earliest in ``text`` (ties by order), or ``None``.

    Only stops that end past ``after`` characters count (vLLM's window for ``min_tokens``).
    """
    best: tuple[int, int] | None = None
    for stop in stops:
        index = text.find(stop, max(0, after - len(stop) + 1))
        if index != -1 and (best is None or index + len(stop) < best[1]):
            best = (index, index + len(stop))
    return best
