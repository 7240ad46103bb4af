"""Text handling shared by the scoring adapters and the eval-framework integrations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from ._types import LoglikelihoodRequest

__all__ = ["EncodePairRequest", "Split", "split_of", "split_trailing_space"]

Split: TypeAlias = Literal["whole", "encode_pair"]
"""Which tokens a loglikelihood request scores where a token crosses the context/continuation boundary.

``"whole"`` (every `LoglikelihoodRequest`; lighteval's own models): the prompt is the tokens of context plus
continuation encoded as one text, and the continuation is what lies beyond the context's own token count (the
last token where the continuation merged whole into the context's last token). ``"encode_pair"`` (lm-eval's
``_encode_pair``): the prompt is the context's own tokens followed by that same tail, so where a merge crosses
the boundary the scored tokens follow the context as it encodes alone, and a continuation that merged whole
into it scores nothing (logprob 0, greedy), as in lm-eval.
"""


@dataclass(frozen=True, slots=True)
class EncodePairRequest(LoglikelihoodRequest):
    """A `LoglikelihoodRequest` split into tokens as lm-eval's ``_encode_pair`` splits it (``"encode_pair"``).

    Private: the lm-eval integration sends these so its scores equal lm-eval's own models' token for token.
    Its own type name keeps its cache entries apart from plain requests'.
    """


def split_of(request: LoglikelihoodRequest) -> Split:
    """The token split ``request`` asks for (`Split`)."""
    return "encode_pair" if isinstance(request, EncodePairRequest) else "whole"


def split_trailing_space(context: str, continuation: str) -> tuple[str, str]:
    """Move the context's trailing whitespace to the front of the continuation, as lm-eval and lighteval do.

    Tokenizers attach a leading space to the next word (``" Paris"``), so ``"is " + "Paris"`` would score an
    unnatural lone-space token; ``"is" + " Paris"`` scores the token the model actually predicts. The
    integrations and the adapters call this one function, so scores agree with the frameworks' own models
    whichever side splits.

    Args:
        context: The conditioning text.
        continuation: The text to score.

    Returns:
        ``(context without trailing whitespace, that whitespace + continuation)``.
    """
    stripped = context.rstrip()
    if len(stripped) == len(context):
        return context, continuation
    return stripped, context[len(stripped) :] + continuation
