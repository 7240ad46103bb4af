"""The ``vllm`` adapter's engine across engine-core deaths: started again, up to ``max_restarts`` times.

When vLLM's engine-core process dies (killed, out of memory, a crash), ``AsyncLLM``'s monitor thread marks the
engine dead and every request it held fails with ``EngineDeadError``; the engine never serves again. Each of
those requests reports the death here (`EngineRestarts.died`): the first report of a death starts one
restart, the others (and requests arriving meanwhile, `EngineRestarts.current`) wait for it, and then each
request is sent again by the adapter to the new engine. A request whose final output came before the death
is never in that set (vLLM hands the error only to the requests it still held), so none is answered twice;
a request that fails with the death is sent again or fails, so none is lost.

Every start uses the same options and environment as the first. Past ``max_restarts`` restarts (counted over
the backend's life), or when a start fails, the engine is given up: every request still waiting and every
later one fails with `BackendBrokenError`, as with ``max_restarts=0``. The dead engine is shut down before
the new one starts (its frontend sockets, threads and ZeroMQ context; its processes have died or are killed
by vLLM's shutdown), so a restart leaks nothing and the new engine gets the memory the dead one held.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ...errors import BackendBrokenError, BackendClosedError, InvalidRequestError

__all__ = ["DEFAULT_MAX_RESTARTS", "EngineDied", "EngineRestarts", "check_max_restarts"]

T = TypeVar("T")

log = logging.getLogger("asyncbackends.adapters.vllm")

DEFAULT_MAX_RESTARTS = 2
"""Restarts of one engine over a backend's life before it is given up (the adapter option's default)."""


def check_max_restarts(value: Any) -> int:
    """Validate the ``max_restarts`` option: an int >= 0.

    Raises:
        InvalidRequestError: Anything else (a bool too).
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidRequestError(f"max_restarts must be an int >= 0, got {value!r}")


class EngineDied(Exception):
    """Raised by a send whose engine died under it (its ``__cause__`` is vLLM's error): send it again."""


class EngineRestarts:
    """The current engine of one backend, started again when it dies (see the module docstring).

    Runs on the engine's loop (the shared loop). The engine objects are ``AsyncLLM`` here; any object works
    (the unit tests use stand-ins).

    Args:
        engine: The running engine.
        start: Starts a new engine with the first one's options and environment (``None``: cannot).
        stop: Shuts an engine down (a dead one too) without blocking the loop.
        max_restarts: Restarts allowed over the backend's life (0 without ``start``).

    Attributes:
        engine: The engine serving now; ``None`` once closed, given up, or between a dead engine's stop and
            the new one's start.
        latest: The engine started last, dead or alive (the dead one until the new one has started); ``None``
            once closed. What the backend shows as its engine.
        label: What the log lines call the engine (``"vllm engine"``, ``"vllm engine-1"``).
        on_restart: Called with the new engine once it has started, before any request is sent to it.
    """

    def __init__(
        self,
        engine: Any,
        *,
        start: Callable[[], Awaitable[Any]] | None,
        stop: Callable[[Any], Awaitable[None]],
        max_restarts: int,
    ) -> None:
        self.engine = engine
        self.latest = engine
        self.max_restarts = max_restarts if start is not None else 0
        self.on_restart: Callable[[Any], None] | None = None
        self.count = 0
        """Restarts so far."""
        self._start = start
        self._stop = stop
        self.label = "vllm engine"
        self._restart: asyncio.Task[None] | None = None
        self._given_up: str | None = None  # why, once no engine will serve again
        self._starting = False  # the restart is past stopping the dead engine
        self._closed = False

    async def current(self, request_id: str | None = None) -> Any:
        """The engine to send a request to, once a restart under way has ended.

        Raises:
            BackendBrokenError: The engine was given up.
            BackendClosedError: The backend was closed.
        """
        while self._restart is not None and not self._closed:
            # wait(), not await: a caller that gives up must not cancel everyone's restart, and a restart
            # cancelled by aclose must not look like this caller's cancellation.
            await asyncio.wait([self._restart])
        self._check(request_id)
        return self.engine

    async def run(self, send: Callable[[Any, bool], Awaitable[T]], request_id: str | None = None) -> T:
        """``send(engine, again)``, sent again to the next engine each time it raises `EngineDied`.

        ``again`` is false the first time. Returns what ``send`` returns.

        Raises:
            BackendBrokenError: The engine died with no restart left, or failed to start again.
            BackendClosedError: The backend was closed.
        """
        again = False
        while True:
            engine = await self.current(request_id)
            try:
                return await send(engine, again)
            except EngineDied as died:
                await self.died(engine, died.__cause__ or died, request_id)
            again = True

    async def check_ready(self, check: Callable[[Any], Awaitable[None]]) -> None:
        """``check(engine)`` (its health); a dead engine is started again first, as a request would have it.

        Raises:
            BackendBrokenError: The engine died with no restart left, or failed to start again.
            BackendClosedError: The backend was closed.
        """
        engine = await self.current()
        try:
            await check(engine)
        except Exception as exc:
            await self.died(engine, exc)  # returns once a new engine serves

    async def died(self, engine: Any, cause: BaseException, request_id: str | None = None) -> None:
        """``engine`` failed a request because it died: return once a new engine serves (send again then).

        The first report of a death starts the restart; reports of the same death wait for it; a report about
        an engine already replaced returns at once.

        Raises:
            BackendBrokenError: No restart is left, or the new engine failed to start.
            BackendClosedError: The backend was closed.
        """
        if engine is self.engine and self._restart is None and self._given_up is None and not self._closed:
            if self.count >= self.max_restarts:
                self._given_up = (
                    f"the {self.label} died ({type(cause).__name__}) after {self.count} restart(s) "
                    f"(max_restarts={self.max_restarts}); build a new backend"
                )
                log.error("%s; its requests fail with BackendBrokenError", self._given_up)
            else:
                self._restart = asyncio.get_running_loop().create_task(self._restart_after(engine, cause))
        await self.current(request_id)

    def _check(self, request_id: str | None) -> None:
        if self._closed:
            raise BackendClosedError("vllm backend was closed", backend="vllm", request_id=request_id)
        if self._given_up is not None:
            raise BackendBrokenError(self._given_up, backend="vllm", request_id=request_id)

    async def _restart_after(self, dead: Any, cause: BaseException) -> None:
        self.count += 1
        log.warning(
            "the %s died (%s: %s); starting it again with the same options (restart %d of at most %d); "
            "the requests it held are sent again",
            self.label,
            type(cause).__name__,
            cause,
            self.count,
            self.max_restarts,
        )
        try:
            await self._stop(dead)  # not cancelled by aclose, which waits for it: never a half-done shutdown
            self.engine = None  # stopped: aclose has nothing left to stop unless a new one starts
            if self._closed:
                return
            self._starting = True
            assert self._start is not None  # max_restarts is 0 without it
            new = await self._start()
        except asyncio.CancelledError:
            raise  # aclose cancelled the start, which shuts its engine down once built
        except Exception as exc:
            self._given_up = (
                f"the {self.label} died ({type(cause).__name__}) and failed to start again "
                f"({type(exc).__name__}: {exc}); build a new backend"
            )
            log.error("%s", self._given_up)
            return
        finally:
            self._restart, self._starting = None, False
        self.engine = self.latest = new
        if self.on_restart is not None:
            self.on_restart(new)
        log.warning("the %s serves again after restart %d", self.label, self.count)

    async def aclose(self) -> None:
        """Refuse new work, end a restart under way, and stop the engine (`stop`), dead or alive.

        A restart stopping the dead engine finishes that; one starting the new engine is cancelled (the start
        shuts its engine down once built).
        """
        self._closed = True
        restart = self._restart
        if restart is not None:
            if self._starting:
                restart.cancel()
            await asyncio.wait([restart])
        engine, self.engine, self.latest = self.engine, None, None
        if engine is not None:
            await self._stop(engine)
