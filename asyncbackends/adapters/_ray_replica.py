"""`ActorReplica`: one Ray actor seen from the driver, as a backend of its own.

Each replica answers `generate`, `loglikelihood` and `loglikelihood_rolling` like any backend, so a router
can treat Ray replicas exactly as it treats HTTP replicas. A call submits one actor task and awaits its
object ref on the caller's loop (an ``ObjectRef`` is awaitable: nothing blocks the shared loop); cancelling
the call cancels the actor task with ``ray.cancel``, which cancels the hosted engine's request. An actor that
died (its process killed, its node lost) raises `ReplicaLostError`, which the owner catches to send the
request to another replica: the request was not answered, so nothing is duplicated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import ray
from ray.exceptions import NodeDiedError, RayActorError, RayTaskError, WorkerCrashedError

from ..errors import AsyncBackendsError, BackendError, BackendUnavailableError
from ..types import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
)

__all__ = ["ActorReplica", "ReplicaLostError"]

log = logging.getLogger("asyncbackends.adapters.ray")

# What awaiting an actor task raises when the actor itself is gone (process or node), not the request.
_LOST = (RayActorError, WorkerCrashedError, NodeDiedError)


class ReplicaLostError(BackendUnavailableError):
    """The replica's actor died (its process was killed or its node lost) before answering."""


class ActorReplica:
    """One started Ray actor hosting a backend.

    Args:
        index: The replica's index (stable across restarts).
        actor: The actor handle.
        info: What the actor's ``start`` replied (name, capabilities, fingerprint, pid, node).
    """

    def __init__(self, index: int, actor: Any, info: dict[str, Any]) -> None:
        self.index = index
        self.actor = actor
        self.info = info
        self.name: str = f"ray[{index}]"
        self.hosted: str = info["name"]
        self.capabilities: Capabilities = info["capabilities"]
        self.alive = True
        self.in_flight = 0

    @property
    def pid(self) -> int:
        """The actor's process id."""
        return int(self.info["pid"])

    @property
    def fingerprint(self) -> dict[str, Any]:
        """The hosted backend's fingerprint (its model identity), or its name."""
        return dict(self.info.get("fingerprint") or {"name": self.hosted})

    def __repr__(self) -> str:
        state = "alive" if self.alive else "lost"
        return f"ActorReplica({self.index}, {self.hosted}, pid={self.info.get('pid')}, {state})"

    async def _call(self, method: str, request: Any) -> Any:
        if not self.alive:
            raise ReplicaLostError(f"Ray replica {self.index} is gone", backend="ray")
        ref = self.actor.call.remote(method, request)
        self.in_flight += 1
        try:
            ok, value = await ref
        except asyncio.CancelledError:
            # An async actor task is cancelled in place: the hosted call sees CancelledError and aborts.
            with contextlib.suppress(Exception):
                ray.cancel(ref)
            raise
        except _LOST as exc:
            self.alive = False
            raise ReplicaLostError(
                f"Ray replica {self.index} (pid {self.info.get('pid')}) was lost: {type(exc).__name__}",
                backend="ray",
                request_id=getattr(request, "request_id", None),
            ) from exc
        except RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, AsyncBackendsError) else None
            if cause is not None:
                raise cause from None
            raise BackendError(
                f"Ray replica {self.index} failed: {exc}",
                backend="ray",
                request_id=getattr(request, "request_id", None),
            ) from exc
        finally:
            self.in_flight -= 1
        if ok:
            return value
        raise value

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate on this replica."""
        return await self._call("generate", request)  # type: ignore[no-any-return]

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Score on this replica."""
        return await self._call("loglikelihood", request)  # type: ignore[no-any-return]

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Score a whole text on this replica."""
        return await self._call("loglikelihood_rolling", request)  # type: ignore[no-any-return]

    async def check(self) -> bool:
        """Readiness probe: the actor answers and its hosted backend is open (and passes its own check)."""
        if not self.alive:
            return False
        try:
            return bool(await asyncio.wait_for(self.actor.check.remote(), 30))
        except (TimeoutError, *_LOST):
            return False

    async def stats(self) -> dict[str, Any]:
        """The actor's own counters (requests answered by id, in flight)."""
        return await self.actor.stats.remote()  # type: ignore[no-any-return]

    async def aclose(self, timeout: float = 30.0) -> None:
        """Close the hosted backend, then kill the actor. Idempotent."""
        actor, self.alive = self.actor, False
        if actor is None:
            return
        self.actor = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(actor.stop.remote(), timeout)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
