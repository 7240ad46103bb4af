"""Serve an aiohttp application on a loopback port: the start-up every look-alike server shares."""

from __future__ import annotations

from typing import Any

from aiohttp import web

__all__ = ["serve"]


async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    """Start serving ``app`` and return its runner (``await runner.cleanup()`` stops it) and the bound port.

    ``port=0`` lets the kernel pick a free port. A client that gives up cancels its handler
    (``handler_cancellation``), so hung requests end with it, and shutdown waits at most half a second.
    """
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    server: Any = site._server
    if server is not None and getattr(server, "sockets", None):
        port = server.sockets[0].getsockname()[1]
    return runner, port
