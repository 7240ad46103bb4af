"""`RecordingBackend`: the mock, writing what each Ray actor answered to a file that outlives the actor.

A SIGKILLed actor takes its in-memory counters with it, so each actor appends ``start``/``done``/``held``
lines to ``<log_dir>/<pid>.log`` instead; the test reads every file to count each request's answers. An
actor whose pid is written in ``hold_file`` holds every request it starts from then on (it never answers
them), so the test can kill it while it certainly has requests in flight.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from asyncbackends._types import GenerationRequest, GenerationResult
from asyncbackends.adapters.mock import MockBackend


class RecordingBackend(MockBackend):
    def __init__(self, *, log_dir: str, hold_file: str, **options: Any) -> None:
        super().__init__(**options)
        self._log = Path(log_dir) / f"{os.getpid()}.log"
        self._hold = Path(hold_file)

    def _write(self, event: str, request_id: str | None) -> None:
        with self._log.open("a") as f:
            f.write(f"{event} {request_id}\n")
            f.flush()
            os.fsync(f.fileno())

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self._write("start", request.request_id)
        if self._hold.exists() and self._hold.read_text().strip() == str(os.getpid()):
            self._write("held", request.request_id)
            await asyncio.Event().wait()  # until the actor dies
        result = await super().generate(request)
        self._write("done", request.request_id)
        return result


def read_events(log_dir: Path) -> dict[int, list[tuple[str, str]]]:
    """Each actor pid's events, in order."""
    events: dict[int, list[tuple[str, str]]] = {}
    for path in log_dir.glob("*.log"):
        lines = [line.split(" ", 1) for line in path.read_text().splitlines() if line]
        events[int(path.stem)] = [(e, rid) for e, rid in lines]
    return events
