"""`all_or_nothing` runs awaitables as one unit; `read_outcome` reads a task's outcome nobody may await.

`all_or_nothing` is used wherever one logical operation fans out inside the library: `gather`'s worker
pool, an adapter's n-sample fan-out, the windows of one rolling loglikelihood.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

__all__ = ["all_or_nothing", "read_outcome"]

T = TypeVar("T")


async def all_or_nothing(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """Await every awaitable concurrently and return their results in order.

    On the first failure, or when the caller is cancelled, every one still running is cancelled and
    awaited before this returns, so nothing is left running; then the first failure (in input order among
    those that failed) is raised. Every finished task's exception is read, so asyncio never reports one as
    "never retrieved".
    """
    if len(awaitables) == 1:
        return [await awaitables[0]]
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        if tasks:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
    errors = [t.exception() for t in tasks if not t.cancelled()]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [t.result() for t in tasks]


def read_outcome(task: asyncio.Future[Any]) -> None:
    """A done callback reading ``task``'s exception, so asyncio never logs it as "never retrieved".

    For a task whose awaiters may all have left before it failed (``task.add_done_callback(read_outcome)``).
    """
    if not task.cancelled():
        task.exception()
