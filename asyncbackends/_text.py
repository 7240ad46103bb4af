"""Text handling shared by the scoring adapters and the eval-framework integrations."""

from __future__ import annotations

__all__ = ["split_trailing_space"]


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
