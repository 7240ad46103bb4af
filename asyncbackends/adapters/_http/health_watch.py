"""`HealthWatch`: the idle limit for answers a server sends whole, kept by asking it whether it lives.

Some answers are asked whole (`delivery`): a vLLM server's chats and tool requests, because its reasoning and
tool parsers split a streamed answer otherwise than a whole one on some outputs (vLLM's streaming parsers drop
a lone end-of-thought token and the characters its detokenizer released with it), and TGI's chats, whose
streamed form (its tool calls above all) is not the whole answer in pieces. No byte of a whole answer arrives
before the last, so the idle limit (``ab.Timeouts.idle``) cannot bound the wait for the next byte. Instead,
while at least one such answer is awaited, one probe per backend asks ``GET /health`` (vLLM's, TGI's) every
``idle / 2`` seconds (the shortest limit of the answers in flight; a shorter one arriving starts the probe
again); any answer below 500 is a sign of life (vLLM answers 503 once its engine died, TGI 503 when its
shards fail their health check; a proxy without the route answers 404, which still shows the server
answers). An answer whose server gave no sign of life for ``idle`` seconds is abandoned with the same
retryable `BackendTimeoutError` a stalled stream gets.

What it cannot see: a server that answers its health check while one request makes no progress (vLLM
schedules every request it holds, so a live engine does not leave one behind; TGI's router passes its
health check on to its model shards, so a shard stuck in a step fails it too).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable
from typing import TypeVar

from ..._tasks import read_outcome
from ...errors import BackendTimeoutError
from .transport import HTTPTransport

__all__ = ["HealthWatch"]

T = TypeVar("T")


class HealthWatch:
    """Bounds whole answers by the server's signs of life; one per backend, its probe started lazily.

    Args:
        http: The backend's transport, rooted where ``path`` is.
        path: The health route (vLLM's and TGI's ``/health``, at the server root).
    """

    def __init__(self, http: HTTPTransport, path: str = "/health") -> None:
        self._http = http
        self._path = path
        self._idles: list[float] = []  # the idle limit of each watched answer in flight
        self._alive_at = -float("inf")  # loop time of the last sign of life
        self._probe: asyncio.Task[None] | None = None
        self.probes = 0
        """Health checks answered so far (for tests and debugging)."""

    async def watch(self, exchange: Awaitable[T], idle: float, *, backend: str, request_id: str | None) -> T:
        """``exchange``'s result, or `BackendTimeoutError` after ``idle`` seconds with no sign of life.

        The exchange's own start counts as a sign of life, so an answer shorter than ``idle / 2`` costs
        no probe.

        Raises:
            BackendTimeoutError: No sign of life for ``idle`` seconds (the exchange is cancelled).
        """
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(exchange)
        # Its outcome may go unread (abandoned, or failing as this watch is cancelled): read it anyway.
        task.add_done_callback(read_outcome)
        start = loop.time()
        sooner = not self._idles or idle < min(self._idles)
        self._idles.append(idle)
        if sooner or self._probe is None or self._probe.done():
            # Started again for a shorter limit than the one it sleeps for. A context of its own: the
            # probe outlives this attempt and must not carry its clock.
            if self._probe is not None:
                self._probe.cancel()
            self._probe = loop.create_task(self._probing(), context=contextvars.Context())
        try:
            while True:
                left = max(self._alive_at, start) + idle - loop.time()
                if left <= 0:
                    raise BackendTimeoutError(
                        f"no sign of life from the server for {idle:g} s while its answer was generated "
                        f"whole (GET {self._path}; the idle timeout)",
                        backend=backend,
                        request_id=request_id,
                    )
                done, _ = await asyncio.wait({task}, timeout=left)
                if done:
                    return task.result()
        finally:
            self._idles.remove(idle)
            probe = self._probe  # read once: `aclose` may clear it from another thread
            if not self._idles and probe is not None:
                probe.cancel()
                self._probe = None
            if not task.done():
                # Awaited, so that its connection slot and the attempt's clock are given back before
                # this attempt ends (a retry may follow at once).
                task.cancel()
                await asyncio.wait({task})

    async def _probing(self) -> None:
        # Probes are sent shortest / 2 apart (the shortest limit in flight), whatever their round trips.
        loop = asyncio.get_running_loop()
        due = loop.time() + min(self._idles) / 2
        while self._idles:
            shortest = min(self._idles)
            await asyncio.sleep(max(0.0, due - loop.time()))
            due = loop.time() + shortest / 2
            try:
                resp = await self._http.request("GET", self._path, timeout=shortest, pooled=False)
            except Exception:  # any failure of the probe is simply no sign of life
                continue
            if resp.status < 500:
                self._alive_at = loop.time()
                self.probes += 1

    async def aclose(self) -> None:
        """Stop the probe, if one runs (the backend closes), and wait until it has stopped."""
        probe, self._probe = self._probe, None
        if probe is None or probe.done():
            return
        loop = probe.get_loop()
        if loop is asyncio.get_running_loop():
            await _stopped(probe)
        elif not loop.is_closed():  # closed from another loop than the shared one it probes on
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_stopped(probe), loop))


async def _stopped(probe: asyncio.Task[None]) -> None:
    probe.cancel()
    await asyncio.gather(probe, return_exceptions=True)
