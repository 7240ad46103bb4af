"""`ReplicaSet`: which live Ray replica takes the next request.

ROUTER SEAM: this is the ``ray`` backend's only replica-selection code, kept deliberately small (least
in-flight requests among live replicas, ties to the lowest index) until it is replaced by the project's
one router (``asyncbackends/wrappers/router.py``: load, health, cool-down, failover, affinity). Each
`ActorReplica` already behaves as a backend with a readiness probe (``check``), which is what that router
routes; replacing this class means handing it the replicas and keeping `remove`/`add` for losses and
restarts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ._ray_replica import ActorReplica

__all__ = ["ReplicaSet"]


class ReplicaSet:
    """The live replicas of one ``ray`` backend. Used on the shared loop only.

    Args:
        replicas: The replicas started with the backend.
    """

    def __init__(self, replicas: list[ActorReplica]) -> None:
        self._live: list[ActorReplica] = list(replicas)
        self._changed: asyncio.Event | None = None  # created on first wait, on the shared loop

    def live(self) -> list[ActorReplica]:
        """The replicas taking requests, by index."""
        return sorted(self._live, key=lambda r: r.index)

    async def pick(self, restarting: Callable[[], bool]) -> ActorReplica | None:
        """The least busy live replica; with none live, wait for a restart, or ``None`` when none comes."""
        while True:
            live = [r for r in self._live if r.alive]
            if live:
                return min(live, key=lambda r: (r.in_flight, r.index))
            if not restarting():
                return None
            if self._changed is None:
                self._changed = asyncio.Event()
            self._changed.clear()
            await self._changed.wait()

    def remove(self, replica: ActorReplica) -> bool:
        """Take a lost replica out; ``False`` when it was already out."""
        replica.alive = False
        if replica in self._live:
            self._live.remove(replica)
            return True
        return False

    def add(self, replica: ActorReplica) -> None:
        """Put a (restarted) replica in."""
        self._live.append(replica)
        self.wake()

    def wake(self) -> None:
        """Wake requests waiting for a replica."""
        if self._changed is not None:
            self._changed.set()

    def close(self) -> list[ActorReplica]:
        """Take every replica out (for closing) and wake the waiters, which then see the backend closed."""
        replicas, self._live = self._live, []
        self.wake()
        return replicas
