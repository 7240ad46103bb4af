"""`RecordingBackend`: the mock, writing what each Ray actor answered to a file that outlives the actor.

A SIGKILLed actor takes its in-memory counters with it, so each actor appends ``start``/``done``/``held``
lines to ``<log_dir>/<pid>.log`` instead; the test reads every file to count each request's answers. An
actor whose pid is written in ``hold_file`` holds every request it starts from then on (it never answers
them), so the test can kill it while it certainly has requests in flight.

``gate_file`` (if given) meters a run across every actor: while the file exists and holds ``N``, a request
started (after its ``start`` line) goes on only while fewer than ``N`` requests have gone on in all, counted
by the ``pass`` lines of every actor's log (two actors may both take the last one: a run's concurrency
bounds that). The test holds a run's requests where they are, on every replica, and lets a number of them
go, or all of them by removing the file.

``not_ready_file`` (if given) fails every readiness check (``check_ready``, the router's probe) while it
exists, and each check writes a ``probe`` line: a test makes new replicas never pass, and counts the tries.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from asyncbackends._types import GenerationRequest, GenerationResult
from asyncbackends.adapters.mock import MockBackend
from asyncbackends.errors import BackendUnavailableError


class RecordingBackend(MockBackend):
    def __init__(
        self,
        *,
        log_dir: str,
        hold_file: str,
        gate_file: str | None = None,
        not_ready_file: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self._log = Path(log_dir) / f"{os.getpid()}.log"
        self._hold = Path(hold_file)
        self._gate = Path(gate_file) if gate_file else None
        self._not_ready = Path(not_ready_file) if not_ready_file else None

    async def check_ready(self) -> None:
        await super().check_ready()
        if self._not_ready is not None and self._not_ready.exists():
            self._write("probe", None)
            raise BackendUnavailableError("recording: not ready (the test's file says so)", backend=self.name)

    def _write(self, event: str, request_id: str | None) -> None:
        with self._log.open("a") as f:
            f.write(f"{event} {request_id}\n")
            f.flush()
            os.fsync(f.fileno())

    def _may_pass(self) -> bool:
        assert self._gate is not None
        try:
            allowed = int(self._gate.read_text())
        except (FileNotFoundError, ValueError):
            return not self._gate.exists()  # removed: everything goes; half-written: look again
        passed = sum(
            line.startswith("pass ")
            for path in self._log.parent.glob("*.log")
            for line in path.read_text().splitlines()
        )
        return passed < allowed

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self._write("start", request.request_id)
        if self._hold.exists() and self._hold.read_text().strip() == str(os.getpid()):
            self._write("held", request.request_id)
            await asyncio.Event().wait()  # until the actor dies
        while self._gate is not None and not self._may_pass():  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.02)  # the file is the test's, in another process
        if self._gate is not None:
            self._write("pass", request.request_id)
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
