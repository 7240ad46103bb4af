"""`Timeouts`: how long one attempt may take as a whole (``total``) and wait for the next byte (``idle``).

``gather`` owns the policy and the adapter handles one request, so the two limits are kept apart:

- ``total`` bounds the whole attempt and is enforced by the run itself (`asyncbackends._clock`), whatever
  the adapter does;
- ``idle`` bounds each wait for the next byte or token of an answer, which only the adapter can see: the run
  sets it in a context variable for the attempts it makes, and an adapter reads it with `idle_timeout`
  (``asyncbackends.abc``) and applies it to each read of a stream (an HTTP adapter's socket reads). A
  generation that keeps producing never trips it, however long it runs.

A plain number keeps its old meaning, a ``total`` alone; ``None`` turns both off. Nothing here is bound to an
event loop.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass

from .errors import InvalidRequestError

__all__ = [
    "DEFAULT_IDLE",
    "DEFAULT_TIMEOUTS",
    "TimeoutOption",
    "Timeouts",
    "as_timeouts",
    "idle_timeout",
    "set_idle_timeout",
]

DEFAULT_IDLE = 120.0
"""Seconds without a byte or token before an attempt counts as stalled, when the caller says nothing."""


def _check(name: str, value: object) -> None:
    # bool is an int subclass; True as a number of seconds is always a mistake.
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        raise InvalidRequestError(f"{name} must be a finite number of seconds > 0 or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per-attempt limits of a run: the whole attempt, and each wait for the next byte or token.

    The defaults let a generation that streams run for as long as it keeps producing (a reasoning model
    thinking for 30 minutes finishes, unretried), while a server that stops sending for two minutes is given
    up on and the attempt retried.

    Example:
        ```python
        ab.run_batch(backend, requests, timeout=ab.Timeouts(total=None, idle=120))
        ab.run_batch(backend, requests, timeout=600)  # a plain number: ab.Timeouts(total=600, idle=None)
        ```

    Args:
        total: Seconds one attempt may take from its start to its answer (waiting for a slot not counted);
            ``None`` for no limit. Enforced by the run for every adapter.
        idle: Seconds an attempt may wait for the next byte or token of its answer; ``None`` for no limit.
            Applied by adapters that read their answer as it comes (``tgi``, ``openai`` and ``endpoints``
            stream generations, or keep an answer asked whole by the server's ``GET /health``; their short
            requests are bounded by it too); an adapter that cannot see
            progress (``vllm`` in-process, ``mock``, a third-party adapter that does not read
            ``asyncbackends.abc.idle_timeout``) is bounded by ``total`` alone.

    Raises:
        InvalidRequestError: A limit that is not a finite number > 0 or ``None``.
    """

    total: float | None = None
    idle: float | None = DEFAULT_IDLE

    def __post_init__(self) -> None:
        _check("Timeouts.total", self.total)
        _check("Timeouts.idle", self.idle)


DEFAULT_TIMEOUTS = Timeouts()
"""A run's timeouts when the caller gives none: no total, 120 s idle."""

TimeoutOption = float | Timeouts | None
"""What ``timeout=`` takes: `Timeouts`, a plain number (a total, as before) or ``None`` (no limit at all)."""


def as_timeouts(value: object) -> Timeouts:
    """The `Timeouts` a ``timeout=`` value means: a number is a total alone, ``None`` no limit at all.

    Raises:
        InvalidRequestError: Neither a `Timeouts`, a finite number > 0 nor ``None``.
    """
    if isinstance(value, Timeouts):
        return value
    if value is None:
        return Timeouts(total=None, idle=None)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        raise InvalidRequestError(
            f"timeout must be an ab.Timeouts, a finite number of seconds > 0 or None, got {value!r}"
        )
    return Timeouts(total=float(value), idle=None)


_idle: contextvars.ContextVar[float | None] = contextvars.ContextVar("asyncbackends_idle", default=None)


def idle_timeout() -> float | None:
    """Seconds the current attempt may wait for the next byte or token of its answer; ``None``: no limit.

    For adapters: read it where the request is sent (the run sets it for each attempt it makes, in the
    attempt's task and the tasks it spawns) and bound each read of the answer by it, so a long answer that
    keeps coming is never cut while a stalled one is. Exceeding it is a `BackendTimeoutError` (retried).
    Outside a run (a direct call to the adapter) it is ``None`` unless a wrapper such as ``ab.limited`` set
    one.
    """
    return _idle.get()


def set_idle_timeout(idle: float | None) -> contextvars.Token[float | None]:
    """Set the idle limit for the current task and the tasks it spawns from here; returns the reset token.

    The tighter of an outer limit (the run's) and ``idle`` wins, so a wrapper cannot loosen a run's limit.
    """
    outer = _idle.get()
    if outer is not None and (idle is None or outer < idle):
        idle = outer
    return _idle.set(idle)
