"""Per-replica adaptive limits: each replica of a router settles at its own capacity.

`ReplicaLimits` gives every replica its own `AdaptiveLimiter`, fed only by that replica's answers: its
refusals cut only its limit, its ``Retry-After`` pauses only it. The router (`asyncbackends._routing.router`)
takes a slot of the chosen replica's limiter around each attempt and chooses only among replicas with a free
slot; `PoolLimit` is what a run (or ``ab.limited``) holding ``concurrency="adaptive"`` on a routed backend
uses instead of a limiter of its own: the sum of the replicas' limits, which learns nothing by itself, so the
run's limit never fights the replicas' (docs/adaptive.md says why).

Everything here lives on the shared loop, with the router and the runs that use it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence

from .._adaptive import AdaptiveConcurrency, AdaptiveLimiter, ChangeReason, Ticket
from .._observability.telemetry import record_replica_limit
from .replica import DRAINING, HEALTHY, REFUSED, Replica

__all__ = ["PoolLimit", "ReplicaLimits"]

log = logging.getLogger(__name__)


def capped(settings: AdaptiveConcurrency, capacity: int | None) -> AdaptiveConcurrency:
    """``settings`` with ``initial``, ``min`` and ``max`` at most ``capacity`` (unchanged where unknown).

    A capacity below 1 (a hint no pool accepts, but an adapter may report) counts as unknown.
    """
    if capacity is None or capacity < 1 or capacity >= settings.max:
        return settings
    return dataclasses.replace(
        settings, initial=min(settings.initial, capacity), min=min(settings.min, capacity), max=capacity
    )


class ReplicaLimits:
    """One adaptive limit per replica of a router.

    Args:
        settings: Every replica's limiter settings.
        replicas: The router's replicas (its own list: a replica added later is seen); each gets its
            ``limiter``, and one added later its own through `add`.
        pool: The router's name, under which the limits are reported.
        freed: Called when a slot frees up (or a limit grows), so attempts waiting for room look again.
    """

    def __init__(
        self, settings: AdaptiveConcurrency, replicas: Sequence[Replica], pool: str, freed: Callable[[], None]
    ) -> None:
        self.settings = settings
        self.replicas = replicas
        self.pool = pool
        self.last_reason: ChangeReason = "clean_round"  # why a replica's limit last moved
        self._freed = freed
        for replica in replicas:
            self.add(replica)

    def add(self, replica: Replica) -> None:
        """Give ``replica`` its own limit (a replica joining).

        It starts at the settings' ``initial``. A replica with a known ``capacity`` (the pool's
        ``capacities``, a replica's ``capacity`` option, its adapter's ``max_concurrency``) is never given
        more: its limit starts at no more than that and never rises above it.
        """
        settings = capped(self.settings, replica.capacity)
        replica.limiter = AdaptiveLimiter(settings, functools.partial(self._changed, replica))
        record_replica_limit(self.pool, replica.label, settings.initial)

    def _changed(self, replica: Replica, limit: int, reason: ChangeReason) -> None:
        self.last_reason = reason
        record_replica_limit(self.pool, replica.label, limit, reason)
        log.debug("replica %s: adaptive limit %d (%s)", replica.label, limit, reason)

    def total(self) -> int:
        """The sum of the limits of the replicas that take attempts: neither refused nor draining."""
        return sum(
            r.limiter.limit
            for r in self.replicas
            if r.state not in (REFUSED, DRAINING) and r.limiter is not None
        )

    @staticmethod
    def has_room(replica: Replica) -> bool:
        """Whether ``replica`` has a free slot under its own limit now (and is not paused)."""
        return replica.limiter is None or replica.limiter.has_room()

    @staticmethod
    def take(replica: Replica) -> Ticket | None:
        """A slot of ``replica``'s limit for one attempt (``None`` if it has none)."""
        return None if replica.limiter is None else replica.limiter.try_acquire()

    def give(self, replica: Replica, ticket: Ticket, error: BaseException | None) -> None:
        """Give the slot back and teach ``replica``'s limiter how the attempt went (``error`` or ``None``)."""
        assert replica.limiter is not None
        replica.limiter.release(ticket, error)
        self._freed()

    def room_wait(self) -> float | None:
        """How long to wait for room when every healthy replica is full: ``None`` with none healthy.

        ``math.inf`` when only an answer frees a slot; else the seconds until the first pause ends.
        """
        healthy = [r for r in self.replicas if r.state == HEALTHY and r.limiter is not None]
        if not healthy:
            return None
        now = time.monotonic()
        pauses = [
            r.limiter.paused_until - now
            for r in healthy
            if r.limiter is not None
            and r.limiter.in_flight < r.limiter.limit
            and r.limiter.paused_until > now
        ]
        return max(0.0, min(pauses)) if pauses else math.inf


class PoolLimit(AdaptiveLimiter):
    """A run's adaptive limit on a routed backend: the sum of its replicas' own limits.

    It learns nothing from the answers (each replica's limiter does, on the shared loop): `release` only
    frees the slot and follows the sum, telling ``on_change`` each time it moved, with the reason of the
    replica move behind it.

    Args:
        limits: The router's per-replica limits.
        on_change: Called with ``(new_limit, reason)`` each time the sum moves.
    """

    def __init__(
        self, limits: ReplicaLimits, on_change: Callable[[int, ChangeReason], None] | None = None
    ) -> None:
        super().__init__(limits.settings, on_change)
        self.replica_limits = limits
        self.limit = self.lowest = self.highest = max(1, limits.total())

    def __repr__(self) -> str:
        return f"PoolLimit(limit={self.limit}, in_flight={self.in_flight}, pool={self.replica_limits.pool!r})"

    async def acquire(self) -> Ticket:
        """Wait for a slot under the replicas' summed limit and take it."""
        self._follow()
        return await super().acquire()

    def release(self, ticket: Ticket, error: BaseException | None) -> None:
        """Give the slot back; the replica that served the attempt has learned from it already."""
        self.in_flight -= 1
        self._follow()
        self._wake()

    def _follow(self) -> None:
        total = max(1, self.replica_limits.total())
        if total == self.limit:
            return
        reason = self.replica_limits.last_reason
        self.limit = total
        self.lowest, self.highest = min(self.lowest, total), max(self.highest, total)
        self.changes[reason] += 1
        if self.on_change is not None:
            self.on_change(total, reason)
