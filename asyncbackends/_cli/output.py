"""How ``asyncbackends run`` delivers results: on stdout alone, in input order as they arrive, kept on Ctrl-C.

Three pieces, each small:

- `results_only_stdout`: while a run goes, file descriptor 1 points at stderr, so whatever an engine prints
  (vLLM's logs, its spawned engine-core process, C libraries) lands on stderr; the results go to a copy of
  the original stdout. ``asyncbackends run ... > out.jsonl`` is then valid JSONL.
- `RecordWriter`: writes one record per request in input order, each as soon as every earlier one is
  written, and flushes it, so an interrupted run has written what finished.
- `stream_outcomes`: runs the requests on the shared loop with `as_completed` and hands each outcome to
  this thread; Ctrl-C cancels the run (engine requests aborted), waits for the clean-up and raises
  `RunInterrupted` with the outcomes that arrived meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from .._gather import as_completed
from .._loop import get_loop_manager
from .._types import Request
from ..errors import AsyncBackendsError, BackendError
from .signals import exit_status

__all__ = ["RecordWriter", "RunInterrupted", "record", "results_only_stdout", "stream_outcomes"]

# Completion fields left out of a record where they hold these values (no reasoning model was involved, no
# token texts reported), and the result's server count where there is none: records stay as they were.
_REASONING_UNSET: dict[str, Any] = {
    "reasoning": None,
    "reasoning_tokens": 0,
    "reasoning_truncated": False,
    "token_texts": (),
}

# How long Ctrl-C waits for the cancelled run's clean-up (engine requests aborted) before giving up.
_CLEANUP_TIMEOUT = 30.0


def record(index: int, request: Request, outcome: Any, adapter: str | None = None) -> dict[str, Any]:
    """The output record of one request: ``result`` or ``error``.

    ``adapter``: the one ``--adapter`` names for requests that name none themselves. The record's
    ``adapter`` is left out for the base model, so records of runs without adapters stay as they were.
    """
    line: dict[str, Any] = {"index": index, "request_id": request.request_id}
    named = request.adapter if request.adapter is not None else adapter
    if named is not None:
        line["adapter"] = named
    if isinstance(outcome, AsyncBackendsError):
        line["error"] = {
            "type": type(outcome).__name__,
            "message": getattr(outcome, "message", str(outcome)),
            "retryable": outcome.retryable if isinstance(outcome, BackendError) else False,
        }
    else:
        result = dataclasses.asdict(outcome)
        result.pop("request_id", None)
        for count in ("generated_tokens", "cached_prompt_tokens"):  # written where the backend reported it
            if result.get(count, 0) is None:
                result.pop(count)
        for completion in result.get("completions", ()):
            # A reasoning model's thinking beside its text; records of other models stay as they were.
            for name, unset in _REASONING_UNSET.items():
                if completion.get(name, unset) == unset:
                    completion.pop(name, None)
        line["result"] = result
    return line


@contextlib.contextmanager
def results_only_stdout(stdout: TextIO) -> Iterator[TextIO]:
    """Yield the stream results go to; meanwhile everything else written to stdout goes to stderr.

    Only a stream on file descriptor 1 is redirected (a test's captured stdout is yielded unchanged).
    Child processes started meanwhile (vLLM's engine core) inherit the redirection.
    """
    try:
        fd = stdout.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        fd = -1
    if fd != 1:
        yield stdout
        return
    stdout.flush()
    saved = os.dup(1)
    results = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    try:
        yield results
    finally:
        with contextlib.suppress(OSError):  # a closed pipe: nothing more can reach the reader anyway
            sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        # A reader that went away (`| head`) fails the final flush; the file is closed all the same.
        with contextlib.suppress(OSError):
            results.close()


class RecordWriter:
    """Writes records in input order, each as soon as every earlier one is written, and flushes each.

    ``adapter``: the ``--adapter`` every request was sent with, for the records of those naming none.
    """

    def __init__(self, sink: TextIO, requests: Sequence[Request], *, adapter: str | None = None) -> None:
        self._sink = sink
        self._requests = requests
        self._adapter = adapter
        self._held: dict[int, Any] = {}
        self._next = 0
        self.written = 0

    def add(self, index: int, outcome: Any) -> None:
        """Take one outcome; write it and the held ones that now follow in order."""
        self._held[index] = outcome
        wrote = False
        while self._next in self._held:
            self._write(self._next, self._held.pop(self._next))
            self._next += 1
            wrote = True
        if wrote:
            self._sink.flush()

    def keep_finished(self, late: Sequence[tuple[int, Any]]) -> None:
        """After an interrupt: write the held outcomes and the results among ``late``, in index order.

        ``late`` arrived while the run was being cancelled; their failures may be the interrupt's own doing
        (an engine stopped by the same Ctrl-C), so only their results are kept.
        """
        for index, outcome in late:
            if not isinstance(outcome, AsyncBackendsError):
                self._held[index] = outcome
        for index in sorted(self._held):
            self._write(index, self._held.pop(index))
        self._sink.flush()

    def _write(self, index: int, outcome: Any) -> None:
        self._sink.write(
            json.dumps(record(index, self._requests[index], outcome, self._adapter), ensure_ascii=False)
            + "\n"
        )
        self.written += 1


class RunInterrupted(Exception):
    """Ctrl-C stopped the run after its clean-up; ``late`` holds the outcomes not yet handed over.

    ``status``: the exit status for the signal that stopped it (`signals.exit_status`).
    """

    def __init__(self, late: list[tuple[int, Any]], status: int = 130) -> None:
        super().__init__("interrupted")
        self.late = late
        self.status = status


def stream_outcomes(
    backend: Any, requests: Sequence[Request], on_outcome: Callable[[int, Any], None], **options: Any
) -> None:
    """Run ``requests`` on the shared loop (`as_completed` options) and call ``on_outcome`` here for each.

    Raises:
        RunInterrupted: Ctrl-C; the run was cancelled and its clean-up waited for (up to a bound).
        BaseException: Whatever ``on_outcome`` or the run raised, after cancelling the run.
    """
    arrived: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
    finished = threading.Event()

    async def drive() -> None:
        stream = as_completed(backend, requests, **options)
        try:
            async for item in stream:
                arrived.put(item)
        finally:
            try:
                close = getattr(stream, "aclose", None)  # closing it cancels the requests still running
                if close is not None:
                    await close()
            finally:
                finished.set()

    future = get_loop_manager().submit(drive())
    try:
        while not finished.is_set() or not arrived.empty():
            try:
                index, outcome = arrived.get(timeout=0.1)  # a timeout keeps Ctrl-C prompt
            except queue.Empty:
                continue
            on_outcome(index, outcome)
        future.result()  # the run's own failure (a cache that cannot be written), if any
    except KeyboardInterrupt as interrupt:
        future.cancel()
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting for the clean-up
            finished.wait(_CLEANUP_TIMEOUT)
        late = []
        while not arrived.empty():
            late.append(arrived.get_nowait())
        raise RunInterrupted(late, exit_status(interrupt)) from None
    except BaseException:
        future.cancel()
        finished.wait(_CLEANUP_TIMEOUT)
        raise
