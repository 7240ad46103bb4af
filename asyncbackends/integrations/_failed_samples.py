"""What the lm-eval and lighteval models share about failures and timeouts.

A prompt that does not fit the model (`ContextLengthError`) is one sample's failure, not the run's: the run
goes on, the sample is scored as failed (an empty answer, a ``-inf`` logprob), never with the error's text
as its answer, and the count is logged. Any other error still stops the run, as before.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from .._timeouts import DEFAULT_IDLE, Timeouts
from ..errors import ContextLengthError, InvalidRequestError

__all__ = ["FAILED_LOGPROB", "FAILED_SCORE", "eval_timeouts", "length_failures"]

FAILED_LOGPROB = -math.inf
"""The logprob a request that did not fit the model scores in lm-eval: below any real one, never chosen."""

FAILED_SCORE = -1e30
"""The same in lighteval, finite: its sample cache reads an infinity back as ``None``."""


def length_failures(outcomes: Sequence[object], what: str, log: logging.Logger) -> set[int]:
    """Indices of the outcomes that are `ContextLengthError`s; the first other error is raised.

    Raises:
        BaseException: The first outcome that is an error of another kind.
    """
    failed = set()
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, ContextLengthError):
            failed.add(index)
        elif isinstance(outcome, BaseException):
            raise outcome
    if failed:
        first = outcomes[min(failed)]
        log.warning(
            "%d of %d %s requests do not fit the model's context and are scored as failed samples (%s)",
            len(failed), len(outcomes), what, first,
        )  # fmt: skip
    return failed


def eval_timeouts(timeout: float | str | None, idle_timeout: float | str | None) -> Timeouts:
    """The run's `Timeouts` from an integration's two options (numbers, or the text of model args).

    One meaning however a value arrives (Python, lm-eval's ``--model_args`` string, which turns ``None`` into
    ``None`` and ``0`` into ``0``, or the text itself): ``None`` (or ``"none"``, ``""``) keeps the default (no
    total; 120 s idle), ``0`` turns that limit off, a positive number of seconds sets it.

    Args:
        timeout: Seconds per attempt in all.
        idle_timeout: The longest wait for the next byte or token.

    Raises:
        InvalidRequestError: A value that is not a number of seconds >= 0 (a negative one, ``True``...).
    """

    def seconds(name: str, value: float | str | None) -> float | None:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            return None
        try:
            if isinstance(value, bool):  # lm-eval's parser makes "true" True: not a number of seconds
                raise ValueError
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not number >= 0:
            raise InvalidRequestError(
                f"{name} must be a number of seconds >= 0 (0: no limit; None: the default), got {value!r}"
            )
        return number

    total, idle = seconds("timeout", timeout), seconds("idle_timeout", idle_timeout)
    return Timeouts(total=total or None, idle=DEFAULT_IDLE if idle is None else (idle or None))
