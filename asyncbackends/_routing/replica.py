"""A replica as the router sees it: its state, its live figures, and which errors are its fault.

A replica is ``healthy`` (takes attempts), ``cooling`` (cooled down after a fault, or joining, probed in the
background until it is taken in), ``draining`` (takes no new attempt; removed once its in-flight ones
ended) or ``refused`` (out of service for good). ``removed`` is reported once a drained replica is gone.
`is_replica_fault` decides whether an error cools the replica down; `sent_nothing` whether a failed attempt
may go to another replica at once; `for_retry` the error a fault is raised as. A router's replica set
(`asyncbackends._routing.replica_set`) drives the state changes, its router (`asyncbackends._routing.router`)
the in-flight counts. A replica also knows the LoRA adapters it may serve (``adapters``, read from its
backend) and the ones it was sent lately (``adapters_held``), which the router's adapter affinity reads.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .._adaptive import AdaptiveLimiter
from ..errors import (
    BackendBrokenError,
    BackendClosedError,
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    InvalidRequestError,
    RateLimitedError,
)

__all__ = [
    "ADAPTER_SLOTS",
    "COOLING",
    "DRAINING",
    "HEALTHY",
    "REFUSED",
    "REMOVED",
    "Replica",
    "ReplicaStats",
    "for_retry",
    "is_replica_fault",
    "sent_nothing",
]

HEALTHY, COOLING, DRAINING, REFUSED = "healthy", "cooling", "draining", "refused"
REMOVED = "removed"  # reported (telemetry, logs) once a drained replica is gone; never a live state

ADAPTER_SLOTS = 8
"""LoRA adapters a replica is taken to hold at once when it does not say (no ``max_loras`` attribute)."""

# The errors that blame the replica whatever their retryable flag says.
_FAULTS = (
    BackendUnavailableError,
    RateLimitedError,
    BackendTimeoutError,
    BackendBrokenError,
    BackendClosedError,
)


def sent_nothing(exc: BaseException) -> bool:
    """Whether a failed attempt certainly sent nothing (the connection was refused), so it may go elsewhere.

    True for an error carrying ``sent_nothing = True`` (a replica proxy can set it) or caused, anywhere in its
    ``__cause__`` chain, by ``ConnectionRefusedError`` or aiohttp's ``ClientConnectorError`` (no connection
    was made). A reset or dropped connection is not: the replica may have started the work.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "sent_nothing", False) is True:
            return True
        if isinstance(current, ConnectionRefusedError):
            return True
        if type(current).__name__ in ("ClientConnectorError", "ClientConnectorDNSError"):
            return True
        current = current.__cause__ or current.__context__
    return False


def is_replica_fault(exc: BaseException) -> bool:
    """Whether ``exc`` says the replica (not the request) is at fault, so the replica is cooled down.

    Faults: `BackendUnavailableError`, `RateLimitedError`, `BackendTimeoutError`, `BackendBrokenError`,
    `BackendClosedError` (a replica closed under the pool), a retryable plain `BackendError` (a 5xx), and
    any non-library exception a replica leaked. Not faults: `RequestRejectedError` and
    `InvalidRequestError`, which every replica would answer the same way.
    """
    if isinstance(exc, InvalidRequestError):
        return False
    if isinstance(exc, _FAULTS):
        return True
    if isinstance(exc, BackendError):
        return type(exc) is BackendError and exc.retryable
    return isinstance(exc, Exception)


def for_retry(replica: Replica, exc: Exception, others: bool) -> Exception:
    """The error to raise for a fault of ``replica``: retryable while ``others`` can take the retry."""
    if isinstance(exc, BackendError):
        if others and not exc.retryable:
            exc.retryable = True  # a dead or closed replica; the pool itself still serves
        return exc
    error = BackendError(f"replica {replica.label}: {type(exc).__name__}: {exc}", retryable=others)
    error.__cause__ = exc
    return error


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """One replica's figures at one moment (counters are since the router was built).

    Attributes:
        label: The replica's name in reports (its URL for HTTP adapters).
        state: ``"healthy"``, ``"cooling"`` (cooled down or joining, probed in the background),
            ``"draining"`` (being removed: takes no new attempt, its in-flight ones end first) or
            ``"refused"`` (its ``verify`` failed for good, for example it serves another model).
        in_flight: Attempts running on it now.
        capacity: The concurrency it was given (or reported), ``None`` where unknown.
        requests: Attempts sent to it.
        successes: Attempts it answered.
        failures: Attempts that failed on it, for any reason.
        cooldowns: Times it was cooled down.
        last_error: The last fault that cooled it down, in words.
        node: Where it runs now, where the backend knows (the Ray node id of a ``ray`` replica).
        limit: Its own adaptive concurrency limit now, where the router keeps one per replica
            (``replica_concurrency="adaptive"``, or a run with ``concurrency="adaptive"`` on the pool); else
            ``None``.
    """

    label: str
    state: str
    in_flight: int
    capacity: int | None
    requests: int
    successes: int
    failures: int
    cooldowns: int
    last_error: str | None = None
    node: str | None = None
    limit: int | None = None


class Replica:
    """One replica as the router sees it: the backend object and its live figures.

    Args:
        backend: Anything with the backend methods, optionally ``check_ready``.
        label: Its name in reports.
        capacity: Requests it serves at once, for load ratios; ``None`` counts in-flight requests alone.
    """

    __slots__ = (
        "_epoch",
        "_probe",
        "_streak",
        "_taken_in",
        "adapter_slots",
        "adapters",
        "adapters_held",
        "backend",
        "capacity",
        "cooldowns",
        "cooled_until",
        "failures",
        "in_flight",
        "label",
        "last_error",
        "limiter",
        "requests",
        "salt",
        "state",
        "successes",
        "weight",
    )

    def __init__(self, backend: Any, *, label: str, capacity: int | None = None) -> None:
        self.backend = backend
        self.label = label
        self.capacity = capacity
        self.weight = float(capacity or 1)
        self.salt = hashlib.blake2b(label.encode(), digest_size=8).digest()
        self.state = HEALTHY
        self.in_flight = self.requests = self.successes = self.failures = self.cooldowns = 0
        self.cooled_until = 0.0
        self.last_error: str | None = None
        self._streak = 0  # faults in a row: the next cool-down is cooldown * 2 ** (streak - 1)
        self._epoch = 0  # bumped when taken back; a success only clears the streak if sent since
        self._taken_in = True  # taken into routing since it joined (`add` clears it until a probe passes)
        self._probe: asyncio.Task[None] | None = None
        self.limiter: AdaptiveLimiter | None = None  # its own adaptive limit, where the router keeps them
        self.adapters, self.adapter_slots = _adapters_of(backend)
        # The LoRA adapters it was sent lately, oldest first (a dict as an ordered set): the ones it most
        # likely holds in its adapter slots, as vLLM evicts the least recently used (`hold_adapter`).
        self.adapters_held: dict[str, None] = {}

    @property
    def load(self) -> float:
        """Requests in flight relative to its own adaptive limit where it has one, else to capacity."""
        if self.limiter is not None:
            return self.in_flight / self.limiter.limit
        return self.in_flight / self.weight

    def serves(self, adapter: str) -> bool:
        """Whether it may be sent a request naming ``adapter`` (its names say so, or it names none)."""
        return self.adapters is None or adapter in self.adapters

    def hold_adapter(self, adapter: str) -> None:
        """Note that an attempt naming ``adapter`` was sent to it: it loads it, evicting the least recent."""
        held = self.adapters_held
        if adapter in held:
            del held[adapter]  # moved to the most recent end
        elif len(held) >= self.adapter_slots:
            del held[next(iter(held))]  # a newcomer takes the slot of the one sent least recently
        held[adapter] = None

    def stats(self) -> ReplicaStats:
        """A snapshot of its figures."""
        return ReplicaStats(
            self.label,
            self.state,
            self.in_flight,
            self.capacity,
            self.requests,
            self.successes,
            self.failures,
            self.cooldowns,
            self.last_error,
            limit=None if self.limiter is None else self.limiter.limit,
        )

    def __repr__(self) -> str:
        return f"Replica({self.label!r}, state={self.state!r}, in_flight={self.in_flight})"


def _adapters_of(backend: Any) -> tuple[frozenset[str] | None, int]:
    """The LoRA adapters ``backend`` serves (``None``: any name, where it does not list them), and its slots.

    Its capabilities not claiming ``adapters``: none. Names from an ``adapters`` attribute holding names (the
    mock's option), where it has one. Slots from a ``max_loras`` attribute (vLLM's option: adapters held in
    the engine at once), else the names' number (vLLM's default holds them all), else `ADAPTER_SLOTS`.
    """
    capabilities = getattr(backend, "capabilities", None)
    if not getattr(capabilities, "adapters", False):
        return frozenset(), ADAPTER_SLOTS
    names = getattr(backend, "adapters", None)
    listed = (
        frozenset(names)
        if isinstance(names, Collection)
        and not isinstance(names, (str, bytes))
        and all(isinstance(n, str) for n in names)
        else None
    )
    slots = getattr(backend, "max_loras", None)
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        slots = len(listed) if listed else ADAPTER_SLOTS
    return listed, slots
