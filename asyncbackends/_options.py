"""A run's policy as one typed, validated value: `RunOptions`, with `RetryPolicy` and `RateLimit`.

`gather`, `run_batch` and `as_completed` take these as keyword arguments and build one `RunOptions` from
them before anything is sent: a bad value or a misspelled option is an `InvalidRequestError` (naming the
closest valid option), raised before a cache file is opened or a request leaves. The run itself
(`asyncbackends._run`) only reads a `RunOptions`; nothing here is bound to an event loop.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypedDict

from ._adaptive import AdaptiveConcurrency
from ._budget import Budget
from ._cache import ResponseCache
from ._limits import RateBuckets
from ._observability.callbacks import RunCallbacks
from ._observability.run_metrics import RunMetrics
from ._timeouts import DEFAULT_TIMEOUTS, TimeoutOption, Timeouts, as_timeouts
from .errors import InvalidRequestError, RateLimitedError

__all__ = [
    "DEFAULT_CONCURRENCY",
    "Concurrency",
    "RateLimit",
    "RetryPolicy",
    "RunOptions",
    "RunOptionsKwargs",
    "adaptive_settings",
    "check_limits",
    "rate_buckets",
    "refuse_unknown_options",
]

DEFAULT_CONCURRENCY = 64
"""In-flight requests when neither the caller nor the backend's capabilities say."""

Concurrency = int | AdaptiveConcurrency | Literal["adaptive"] | None
"""A run's ``concurrency``: a fixed limit, an adaptive one (``"adaptive"`` or its settings), or None."""


def adaptive_settings(concurrency: object) -> AdaptiveConcurrency | None:
    """The adaptive settings ``concurrency`` asks for (``"adaptive"``: the defaults), ``None`` if fixed.

    Raises:
        InvalidRequestError: ``concurrency`` is neither ``None``, an int >= 1, ``"adaptive"`` nor an
            `AdaptiveConcurrency`.
    """
    if isinstance(concurrency, AdaptiveConcurrency):
        return concurrency
    if concurrency == "adaptive" and isinstance(concurrency, str):
        return AdaptiveConcurrency()
    if concurrency is not None and (
        not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
    ):
        raise InvalidRequestError(
            "concurrency must be an int >= 1, 'adaptive', an AdaptiveConcurrency or None, "
            f"got {concurrency!r}"
        )
    return None


def _is_number(value: object) -> bool:
    # bool is an int subclass; True as a delay or a rate is always a mistake.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How `gather` retries a failed attempt whose error has ``retryable`` set.

    Delays grow exponentially from ``initial_delay`` and are capped at ``max_delay``; with ``jitter`` each is
    drawn uniformly from zero to that value ("full jitter"), so many failed requests do not retry in step. A
    `RateLimitedError` with ``retry_after`` waits at least that long, capped at ``max_delay``.

    Args:
        max_attempts: Attempts per request, the first one included (1 disables retries).
        initial_delay: Seconds before the second attempt (before jitter).
        max_delay: Cap on any one delay, ``Retry-After`` included.
        jitter: Draw each delay uniformly from [0, delay].
    """

    max_attempts: int = 3
    initial_delay: float = 0.5
    max_delay: float = 30.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if (
            not isinstance(self.max_attempts, int)
            or isinstance(self.max_attempts, bool)
            or self.max_attempts < 1
        ):
            raise InvalidRequestError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        for name in ("initial_delay", "max_delay"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 <= value < float("inf"):
                raise InvalidRequestError(f"{name} must be a finite number >= 0, got {value!r}")
        if not isinstance(self.jitter, bool):
            raise InvalidRequestError(f"jitter must be a bool, got {self.jitter!r}")

    def delay(self, failed_attempt: int, error: BaseException, rng: random.Random | None = None) -> float:
        """Seconds to wait after attempt number ``failed_attempt`` (1-based) failed with ``error``."""
        delay = float(min(self.max_delay, self.initial_delay * 2.0 ** (failed_attempt - 1)))
        if self.jitter:
            delay = float((rng or random).uniform(0, delay))
        if isinstance(error, RateLimitedError) and error.retry_after is not None:
            delay = max(delay, min(error.retry_after, self.max_delay))
        return delay


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Client-side rate limits, enforced by token buckets shared by one run's workers.

    Args:
        requests_per_second: Most requests started per second (bursts of up to one second's worth).
        tokens_per_minute: Most tokens per minute, each request counted before it is sent as its prompt's
            estimated size (token ids counted, text at four characters a token) plus ``max_tokens * n``.
    """

    requests_per_second: float | None = None
    tokens_per_minute: float | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_second", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not 0 < value < float("inf")):
                raise InvalidRequestError(f"{name} must be a finite number > 0 or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything that decides how one run sends its requests; checked when built.

    The keyword arguments of `gather`, `run_batch` and `as_completed` are exactly these fields.

    Args:
        concurrency: Most requests in flight; ``None`` takes the backend's ``capabilities.max_concurrency``,
            else `DEFAULT_CONCURRENCY`; ``"adaptive"`` or an `AdaptiveConcurrency` finds the server's
            capacity as the run goes (`asyncbackends._adaptive`).
        retry: Retry policy for retryable errors; ``None`` means ``RetryPolicy()``.
        timeout: Per-attempt limits (`Timeouts`): by default no total and 120 s without a byte or token
            (a generation that streams runs as long as it produces); a plain number is a total alone
            (waiting for a slot does not count); ``None`` for no limit at all. Stored as the `Timeouts` it
            means (``timeout=30`` reads back as ``Timeouts(total=30.0, idle=None)``), read typed through
            `timeouts`.
        rate_limit: Client-side request and token rate limits, for this run alone.
        progress: Show a tqdm bar (``True``, or a ``str`` for its label).
        cache: A `ResponseCache` or a path to one (opened when the run starts, closed when it ends).
        return_exceptions: Return a failed request's error in its place instead of raising.
        metrics: A `RunMetrics` to fill in as the run goes.
        callbacks: A `RunCallbacks` whose functions are called as requests end, retry and use tokens.
        batch: Send the generation requests through the backend's provider batch API (`SupportsBatch`,
            ``openai``): half the price, answered within the provider's window; ``concurrency``,
            a ``timeout`` total and ``rate_limit`` have no meaning then and are refused.
        budget: The most the run may spend (`Budget`: tokens, cost at the backend's `Pricing`); a request
            whose worst case would pass it is not sent and ends with `BudgetExceededError`.

    Raises:
        InvalidRequestError: A value of the wrong type or out of range.
    """

    concurrency: Concurrency = None
    retry: RetryPolicy | None = None
    timeout: TimeoutOption = DEFAULT_TIMEOUTS
    rate_limit: RateLimit | None = None
    progress: bool | str = False
    cache: ResponseCache | str | os.PathLike[str] | None = None
    return_exceptions: bool = False
    metrics: RunMetrics | None = None
    callbacks: RunCallbacks | None = None
    batch: bool = False
    budget: Budget | None = None

    def __post_init__(self) -> None:
        check_limits(self.concurrency, self.rate_limit)
        # Normalised once, here: whatever reads a run's options reads one Timeouts.
        object.__setattr__(self, "timeout", as_timeouts(self.timeout))
        _check_type("retry", self.retry, RetryPolicy)
        _check_type("metrics", self.metrics, RunMetrics)
        _check_type("callbacks", self.callbacks, RunCallbacks)
        _check_type("budget", self.budget, Budget)
        _check_type("cache", self.cache, (ResponseCache, str, os.PathLike))
        if not isinstance(self.progress, (bool, str)):
            raise InvalidRequestError(f"progress must be a bool or a str, got {type(self.progress).__name__}")
        if not isinstance(self.return_exceptions, bool):
            raise InvalidRequestError(f"return_exceptions must be a bool, got {self.return_exceptions!r}")
        if not isinstance(self.batch, bool):
            raise InvalidRequestError(f"batch must be a bool, got {self.batch!r}")
        if self.batch:
            # The provider paces a batch (answered within its window, hours): a client-side bound on
            # requests in flight, per attempt or per second would bound nothing. The idle limit is left
            # alone (it is on by default); nothing in a batch run streams.
            for name, value in (
                ("concurrency", self.concurrency),
                ("timeout", self.timeouts.total),
                ("rate_limit", self.rate_limit),
            ):
                if value is not None:
                    raise InvalidRequestError(f"{name} has no meaning with batch=True (the provider paces)")
            if self.budget is not None:
                raise InvalidRequestError(
                    "budget is not supported with batch=True yet: a batch is sent whole; give it the "
                    "requests the budget covers, or send them without batch=True"
                )

    @property
    def timeouts(self) -> Timeouts:
        """`timeout` as stored: the one `Timeouts` it was normalised to when these options were built."""
        assert isinstance(self.timeout, Timeouts)
        return self.timeout


def check_limits(concurrency: Concurrency, rate_limit: RateLimit | None) -> AdaptiveConcurrency | None:
    """Check the limits a run and `ab.limited` both take; the adaptive settings asked for, if any.

    Raises:
        InvalidRequestError: ``concurrency`` is not valid (see `adaptive_settings`) or ``rate_limit`` is
            not a `RateLimit`.
    """
    _check_type("rate_limit", rate_limit, RateLimit)
    return adaptive_settings(concurrency)


def rate_buckets(rate_limit: RateLimit | None) -> RateBuckets | None:
    """Fresh buckets for ``rate_limit``'s rates, or ``None`` without one."""
    if rate_limit is None:
        return None
    return RateBuckets(rate_limit.requests_per_second, rate_limit.tokens_per_minute)


def _check_type(name: str, value: object, expected: type | tuple[type, ...]) -> None:
    if value is not None and not isinstance(value, expected):
        names = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
        raise InvalidRequestError(f"{name} must be a {names} or None, got {type(value).__name__}")


class RunOptionsKwargs(TypedDict, total=False):
    """The run options `gather`, `run_batch` and `as_completed` take as ``**options`` (PEP 692).

    `RunOptions`' fields but ``return_exceptions``, which each entry point names itself because it decides
    the type of what it returns. Each is documented on `RunOptions`.
    """

    concurrency: Concurrency
    retry: RetryPolicy | None
    timeout: TimeoutOption
    rate_limit: RateLimit | None
    progress: bool | str
    cache: ResponseCache | str | os.PathLike[str] | None
    metrics: RunMetrics | None
    callbacks: RunCallbacks | None
    batch: bool
    budget: Budget | None


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(RunOptions))
"""The keyword arguments every gathering entry point takes."""


def refuse_unknown_options(options: Mapping[str, object]) -> None:
    """Refuse the keyword arguments in ``options`` that are not run options, naming the closest valid one.

    Raises:
        InvalidRequestError: ``options`` holds a name that is no `RunOptions` field.
    """
    unknown = [name for name in options if name not in OPTION_NAMES]
    if not unknown:
        return
    name = sorted(unknown)[0]

    # A valid name inside the wrong one ("max_concurrency") or sharing its first four letters ("retries")
    # beats edit distance alone, which would pair "retries" with "metrics".
    def shared_prefix(option: str) -> int:
        return next((i for i, (a, b) in enumerate(zip(option, name, strict=False)) if a != b), len(option))

    contained = [option for option in OPTION_NAMES if option in name or name in option]
    prefixed = sorted((o for o in OPTION_NAMES if shared_prefix(o) >= 4), key=shared_prefix, reverse=True)
    close = contained or prefixed[:1] or difflib.get_close_matches(name, OPTION_NAMES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; valid options: {', '.join(OPTION_NAMES)}"
    raise InvalidRequestError(f"unknown run option {name!r}{hint}")
