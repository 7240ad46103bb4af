"""The answer a framework scores from a completion of a reasoning model: never the thought.

A backend that splits (a reasoning parser, reasoning tags: `Completion.reasoning` set) already gives the
answer as its text. Where it does not, the frameworks' own options name the tags and the split is made
here, with the fix their own models lack: a thought that never closed (the token limit came first) is an
empty answer, never the answer (lm-eval issue 3382, lighteval issue 869).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._results import Completion
from ..errors import InvalidRequestError

__all__ = ["Answer", "answer_after", "answer_without_tags", "check_tag_pairs"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What is scored, and whether the thought was cut off (``text`` is then ``""``)."""

    text: str
    unclosed: bool = False


def _split_by_backend(completion: Completion) -> Answer | None:
    if completion.reasoning is not None or completion.reasoning_truncated:
        return Answer(completion.text, completion.reasoning_truncated)
    return None


def answer_after(completion: Completion, think_end: str | None) -> Answer:
    """lm-eval's ``think_end_token``: the text after the last ``think_end``; none in the text: unclosed.

    As lm-eval's models do, the answer's leading whitespace is dropped; unlike them, a text without the
    token is an unfinished thought and scores as ``""`` (theirs scored the whole thought).
    """
    split = _split_by_backend(completion)
    if split is not None or not think_end:
        return split or Answer(completion.text)
    _, found, answer = completion.text.rpartition(think_end)
    if not found:
        return Answer("", unclosed=True)
    return Answer(answer.lstrip())


def answer_without_tags(completion: Completion, tag_pairs: Sequence[tuple[str, str]]) -> Answer:
    """The answer under lighteval's reasoning tags: each closed ``start ... end`` span removed, as it does.

    Tags given mean the model thinks first (as vLLM's reasoning parsers assume), which covers what
    lighteval's own removal misses: an end tag with no start before it ends a thought the chat template
    opened in the prompt, and a text with no end tag at all, or a start left without its end, is a thought
    the token limit cut off: the answer is ``""``.
    """
    split = _split_by_backend(completion)
    if split is not None or not tag_pairs:
        return split or Answer(completion.text)
    text = completion.text
    if not any(end in text for _, end in tag_pairs):
        return Answer("", unclosed=True)
    for start, end in tag_pairs:
        first_end, first_start = text.find(end), text.find(start)
        if first_end >= 0 and (first_start < 0 or first_end < first_start):
            text = text[first_end + len(end) :]  # opened by the prompt: the text began inside the thought
        while (at := text.find(start)) >= 0:
            close = text.find(end, at + len(start))
            if close < 0:
                return Answer("", unclosed=True)
            text = text[:at] + text[close + len(end) :]
    return Answer(text)


def check_tag_pairs(value: object) -> list[tuple[str, str]]:
    """``value`` as a list of ``(start, end)`` pairs of non-empty strings, or a clear error."""
    pairs = [value] if isinstance(value, tuple) else value
    if not isinstance(pairs, list | tuple) or not pairs:
        raise InvalidRequestError(f"reasoning_tags must be a list of (start, end) pairs, got {value!r}")
    checked = []
    for pair in pairs:
        if not (
            isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(t, str) and t for t in pair)
        ):
            raise InvalidRequestError(
                f"reasoning_tags must be (start, end) pairs of non-empty strings, got {pair!r} in {value!r}"
            )
        checked.append((pair[0], pair[1]))
    return checked
