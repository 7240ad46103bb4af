"""`read_outcome`: a task whose failure nobody awaits is not reported as "never retrieved"."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from asyncbackends._tasks import read_outcome


async def _fail() -> None:
    raise ValueError("nobody awaits this")


def test_read_outcome_keeps_an_unawaited_failure_from_being_reported() -> None:
    reported: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
        for callback in (None, read_outcome):
            task: Any = loop.create_task(_fail())
            if callback is not None:
                task.add_done_callback(callback)
            await asyncio.wait({task})  # done, its exception never read by anyone
            del task
            gc.collect()

    asyncio.run(main())
    # Without the callback asyncio reports the failure; with it, nothing.
    assert reported == ["Task exception was never retrieved"]
