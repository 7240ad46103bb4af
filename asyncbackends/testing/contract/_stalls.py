"""Watching the shared loop for stalls while an adapter works, and finding where the loop thread was stuck.

A heartbeat task on the loop sleeps a short interval again and again; a beat that comes late by more than the
threshold is a stall. A watchdog thread samples the loop thread's Python stack halfway into every stall
(``sys._current_frames``), so a stall is attributed to the code the loop was stuck in, not guessed at: a
``time.sleep`` or a sync HTTP call inside an adapter's ``async def`` shows up as that line, while a loop
thread that was merely waiting for a CPU on a loaded machine shows no adapter frame at all.
"""

from __future__ import annotations

import asyncio
import inspect
import linecache
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

from ..._loop import get_loop_manager

__all__ = ["Frame", "LoopWatch", "Stall", "watch_loop"]

_INTERVAL = 0.01
_MAX_FRAMES = 64
_METHODS = ("generate", "loglikelihood", "loglikelihood_rolling")


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a sampled stack."""

    code: CodeType
    filename: str
    lineno: int

    def __str__(self) -> str:
        source = linecache.getline(self.filename, self.lineno).strip()
        where = f"{self.filename}:{self.lineno} in {self.code.co_name}"
        return f"{where}: {source}" if source else where


@dataclass(slots=True)
class Stall:
    """One late heartbeat: how late, and the loop thread's stack sampled during it (innermost last)."""

    seconds: float
    stack: tuple[Frame, ...] = ()


@dataclass
class LoopWatch:
    """What a `watch_loop` block saw: the stalls over the threshold."""

    threshold: float
    stalls: list[Stall] = field(default_factory=list)
    beats: int = 0


def _stack(frame: FrameType | None) -> tuple[Frame, ...]:
    frames: list[Frame] = []
    while frame is not None and len(frames) < _MAX_FRAMES:
        frames.append(Frame(frame.f_code, frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(reversed(frames))


def adapter_code(backend: Any) -> tuple[set[CodeType], set[str]]:
    """The backend's request methods' code objects and its classes' source files (not the library's base)."""
    from ..._protocol import BaseBackend

    codes: set[CodeType] = set()
    files: set[str] = set()
    for klass in type(backend).__mro__:
        if klass in (object, BaseBackend) or klass.__module__ == "builtins":
            continue
        for name in _METHODS:
            function = vars(klass).get(name)
            code = getattr(function, "__code__", None)
            if isinstance(code, CodeType):
                codes.add(code)
        try:
            files.add(inspect.getfile(klass))
        except (TypeError, OSError):
            continue
    return codes, files


def in_adapter(stack: tuple[Frame, ...], codes: set[CodeType], files: set[str]) -> Frame | None:
    """The innermost frame of ``stack`` in the adapter's code, or ``None`` if the loop was elsewhere."""
    for frame in reversed(stack):
        if frame.code in codes or frame.filename in files:
            return frame
    return None


@contextmanager
def watch_loop(threshold: float) -> Iterator[LoopWatch]:
    """Watch the shared loop for the duration of the block; stalls longer than ``threshold`` are recorded."""
    manager = get_loop_manager()
    watch = LoopWatch(threshold)
    stop = threading.Event()
    samples: dict[int, tuple[Frame, ...]] = {}
    latest: list[tuple[int, float]] = [(0, time.monotonic())]  # (beat number, when), replaced whole

    async def loop_thread() -> int:
        return threading.get_ident()

    loop_thread_id = manager.run(loop_thread())

    async def heartbeat() -> None:
        previous = time.monotonic()
        while not stop.is_set():
            latest[0] = (watch.beats, previous)
            await asyncio.sleep(_INTERVAL)
            now = time.monotonic()
            late = now - previous - _INTERVAL
            if late > threshold:
                watch.stalls.append(Stall(late, samples.pop(watch.beats, ())))
            samples.pop(watch.beats, None)
            watch.beats += 1
            previous = now

    def watchdog() -> None:
        while not stop.wait(min(0.005, threshold / 10)):
            beat, since = latest[0]
            if beat not in samples and time.monotonic() - since - _INTERVAL > threshold / 2:
                samples[beat] = _stack(sys._current_frames().get(loop_thread_id))

    beating = manager.submit(heartbeat())
    sampler = threading.Thread(target=watchdog, name="asyncbackends-contract-watchdog", daemon=True)
    sampler.start()
    try:
        yield watch
    finally:
        stop.set()
        sampler.join()
        beating.result(timeout=max(10.0, 10 * threshold))
