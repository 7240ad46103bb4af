"""The failures `FakeTGIServer` injects: which one an attempt gets, and what each one does on the wire.

A failure is 429 (TGI's "Model is overloaded"), 424 (failed during generation), 500 (incomplete
generation), 503 (a proxy's plain-text answer), ``"drop"`` (the connection is aborted, no answer) or
``"hang"`` (no answer until the server stops); ``"stall"`` (a stream that stops sending midway) and
``"freeze"`` (a hang that ``GET /health`` shares) are played by the server itself.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from .validation import WireError

__all__ = ["choose_failure", "fail"]


def choose_failure(
    attempt: int, fail_attempts: int, failure: Any, rates: Mapping[Any, float], rng: random.Random
) -> Any:
    """The failure this attempt of an input gets, or ``None``.

    Args:
        attempt: Which attempt of its input this is (1 for the first).
        fail_attempts: Each input's first ``fail_attempts`` attempts get ``failure``.
        failure: The failure those attempts get.
        rates: Otherwise, each failure's probability, drawn in order until one hits.
        rng: The generator the draws come from.
    """
    if attempt <= fail_attempts:
        return failure
    for kind, rate in rates.items():
        if rate and rng.random() < rate:
            return kind
    return None


async def fail(failure: Any, request: web.Request, stopping: asyncio.Event | None) -> None:
    """Play ``failure`` on this request: raise its `WireError`, drop the connection or hang.

    Returns at once for ``None`` (no failure).

    Raises:
        WireError: The error response of a 429, 424, 500 or 503.
        asyncio.CancelledError: A dropped connection, or a hang ended by the server stopping.
    """
    if failure == "drop":
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError  # the connection is gone: nothing to answer
    if failure == "hang":
        assert stopping is not None
        await stopping.wait()
        raise asyncio.CancelledError
    if failure == 429:
        raise WireError.json_error(429, "Model is overloaded", "overloaded")
    if failure == 424:
        raise WireError.json_error(424, "Request failed during generation: injected failure", "generation")
    if failure == 500:
        raise WireError.json_error(500, "Incomplete generation", "incomplete_generation")
    if failure == 503:
        raise WireError(503, "503 Service Unavailable (injected by a proxy)", text=True)
