"""`ActorSlot`: one replica slot of the ``ray`` backend, seen by the router as a backend of its own.

A slot holds the Ray actor currently serving it. A call submits one actor task and awaits its object ref on
the caller's loop (an ``ObjectRef`` is awaitable: nothing blocks the shared loop); cancelling the call
cancels the actor task with ``ray.cancel``, which cancels the hosted engine's request.

When the actor dies (process killed, node lost) or its hosted engine breaks, every call in flight on it
raises `ReplicaLostError`, which says ``sent_nothing``: no answer came back, so the router sends the request
to another replica inside the same attempt and nothing is duplicated. The slot reports the loss once to its
owner, which restarts the slot (a new actor in the same reserved bundle; `check_ready`, the router's probe,
waits for it) or drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from ray.exceptions import NodeDiedError, RayActorError, RayTaskError, WorkerCrashedError

from ..._types import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
)
from ...errors import AsyncBackendsError, BackendBrokenError, BackendError, BackendUnavailableError

__all__ = ["ActorSlot", "ReplicaLostError", "Started"]

log = logging.getLogger("asyncbackends.adapters.ray")

# What awaiting an actor task raises when the actor itself is gone (process or node), not the request.
_LOST = (RayActorError, WorkerCrashedError, NodeDiedError)

Started = tuple[Any, dict[str, Any]]
"""A started actor and what its ``start`` replied (name, capabilities, fingerprint, pid, node)."""


class ReplicaLostError(BackendUnavailableError):
    """The replica's actor died, or its engine broke, before answering: the request may go elsewhere."""

    sent_nothing = True  # read by the router: no answer came back, so another replica may take it


class ActorSlot:
    """One replica slot: the actor serving it now, restarted in place when it is lost.

    Args:
        index: The slot's index (stable across restarts, never reused by its backend: its label).
        started: The first actor and its start reply.
        spawn: Starts a replacement actor: ``spawn(index, group, bundle)``.
        group: The placement group holding the slot's reserved bundle (the start-up group, or one of its own
            for a replica added by a resize).
        bundle: The bundle's index in ``group``.
        on_lost: Told once per lost actor (the owner logs, counts, restarts or drops).
    """

    def __init__(
        self,
        index: int,
        started: Started,
        *,
        spawn: Callable[[int, Any, int], Awaitable[Started]],
        group: Any,
        bundle: int,
        on_lost: Callable[[ActorSlot, BaseException], None] | None = None,
    ) -> None:
        self.index = index
        self.group, self.bundle = group, bundle
        self.actor, self.info = started
        self.hosted: str = self.info["name"]
        self.capabilities: Capabilities = self.info["capabilities"]
        self._spawn = spawn
        self.on_lost = on_lost
        self.unanswered = 0  # requests in flight on a lost actor, raised for the router to send elsewhere
        self._restart: asyncio.Task[None] | None = None
        self.dropped = False
        self.draining = False  # being removed by a resize: a loss now drops it instead of restarting it

    @property
    def pid(self) -> int:
        """The current actor's process id."""
        return int(self.info["pid"])

    @property
    def fingerprint(self) -> dict[str, Any]:
        """The hosted backend's fingerprint (its model identity), or its name."""
        return dict(self.info.get("fingerprint") or {"name": self.hosted})

    @property
    def alive(self) -> bool:
        """Whether an actor serves the slot now."""
        return self.actor is not None

    def __repr__(self) -> str:
        state = "alive" if self.alive else ("dropped" if self.dropped else "restarting")
        return f"ActorSlot({self.index}, {self.hosted}, pid={self.info.get('pid')}, {state})"

    # -- requests --------------------------------------------------------------------------------------

    async def _call(self, method: str, request: Any) -> Any:
        actor = self.actor
        request_id = getattr(request, "request_id", None)
        if actor is None:
            self.unanswered += 1
            raise ReplicaLostError(f"Ray replica {self.index} has no actor now", request_id=request_id)
        ref = actor.call.remote(method, request)
        try:
            ok, value = await ref
        except asyncio.CancelledError:
            # An async actor task is cancelled in place: the hosted call sees CancelledError and aborts.
            with contextlib.suppress(Exception):
                ray.cancel(ref)
            raise
        except _LOST as exc:
            why = f"Ray replica {self.index} (pid {self.info.get('pid')}) was lost: {type(exc).__name__}"
            raise self._lost_with(actor, exc, why, request_id) from exc
        except RayTaskError as exc:
            if isinstance(exc.cause, AsyncBackendsError):
                raise exc.cause from None
            message = f"Ray replica {self.index} failed: {exc}"
            raise BackendError(message, backend="ray", request_id=request_id) from exc
        if ok:
            return value
        if isinstance(value, BackendBrokenError):
            # The engine died under the actor: as good as a lost actor (its request was never answered).
            why = f"Ray replica {self.index}: its {self.hosted} backend broke: {value}"
            raise self._lost_with(actor, value, why, request_id) from value
        raise value

    def _lost_with(
        self, actor: Any, cause: BaseException, why: str, request_id: str | None
    ) -> ReplicaLostError:
        """Note the loss of ``actor`` and count its unanswered request: the error to raise for it."""
        self.lost(actor, cause)
        self.unanswered += 1
        return ReplicaLostError(why, backend="ray", request_id=request_id)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate on this replica."""
        return await self._call("generate", request)  # type: ignore[no-any-return]

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Score on this replica."""
        return await self._call("loglikelihood", request)  # type: ignore[no-any-return]

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Score a whole text on this replica."""
        return await self._call("loglikelihood_rolling", request)  # type: ignore[no-any-return]

    async def check_ready(self) -> None:
        """The router's readiness probe: a live actor whose hosted backend passes its own check.

        A slot being restarted waits for the new actor first (bounded by the router's probe timeout).

        Raises:
            BackendUnavailableError: The actor is gone (or dropped), or its backend is not ready.
        """
        if self._restart is not None:
            await asyncio.shield(self._restart)
        actor = self.actor
        if actor is None:
            raise BackendUnavailableError(f"Ray replica {self.index} was dropped", backend="ray")
        try:
            ok, error = await actor.check_ready.remote()
        except _LOST as exc:
            self.lost(actor, exc)
            raise BackendUnavailableError(f"Ray replica {self.index} was lost", backend="ray") from exc
        if not ok:
            raise error

    async def stats(self) -> dict[str, Any]:
        """The current actor's own counters (requests answered by id, in flight)."""
        if self.actor is None:
            raise BackendUnavailableError(f"Ray replica {self.index} has no actor now", backend="ray")
        return await self.actor.stats.remote()  # type: ignore[no-any-return]

    # -- losses and restarts ---------------------------------------------------------------------------

    def lost(self, actor: Any, exc: BaseException) -> None:
        """Note that ``actor`` is gone; the first call to notice it tells the owner."""
        if actor is not self.actor:
            return  # already noticed (many requests were in flight on it)
        self.actor = None
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)  # a broken engine's actor may still run: free its bundle
        if self.on_lost is not None:
            self.on_lost(self, exc)

    def restart(self, on_done: Callable[[ActorSlot, BaseException | None], None]) -> None:
        """Start a new actor for this slot in the background; ``on_done`` hears how it went."""

        async def respawn() -> None:
            try:
                self.actor, self.info = await self._spawn(self.index, self.group, self.bundle)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.dropped = True
                on_done(self, exc)
            else:
                on_done(self, None)

        self._restart = asyncio.ensure_future(respawn())

    def drop(self) -> None:
        """Give the slot up for good."""
        self.dropped = True

    async def aclose(self, timeout: float = 30.0) -> None:
        """Stop a restart under way, close the hosted backend, then kill the actor. Idempotent."""
        self.dropped = True
        restart, self._restart = self._restart, None
        if restart is not None and not restart.done():
            restart.cancel()
            with contextlib.suppress(BaseException):
                await restart
        actor, self.actor = self.actor, None
        if actor is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(actor.stop.remote(), timeout)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
