"""`GroupWriter`: the response cache's results committed in groups, on a thread, not the event loop.

One committed SQLite transaction per result costs more than the mock backend's whole request; a group of
results in one transaction costs about the same as one. A result handed to `GroupWriter.put` waits at most
``window`` seconds (or until ``max_rows`` are waiting) before its group is committed by the writer's thread,
so the loop only appends to a dict. A writer that falls behind (a slow disk, a loaded machine) holds the
run back rather than the results: `GroupWriter.backlog` counts those queued and not yet committed, and a run
takes no new request while ``backlog`` results wait (`_run_feed.Gate`). A run killed at any instant loses
at most the results of the group not yet committed (its requests are sent again by the resume); what is
committed is whole, since a group is one transaction. Until committed, results stay readable from
`GroupWriter.get`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from ._run_feed import Gate
from ._types import Result

__all__ = ["DEFAULT_WINDOW", "GroupWriter", "Row"]

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 0.05  # seconds a result may wait for its group's commit
DEFAULT_MAX_ROWS = 5_000  # a group committed at once when this many wait
DEFAULT_BACKLOG = 20_000  # a run sends nothing new while this many wait uncommitted

Row = tuple[Result, str]  # a result and the backend name it is stored under


class GroupWriter:
    """Results waiting to be committed, and the thread that commits them in groups.

    Args:
        commit: Stores one group (key -> row) in one transaction; called on the writer's thread.
        window: Most seconds a result waits before its group is committed.
        max_rows: A group is committed at once when this many results wait.
        backlog: Results queued and not committed at which a run waits (`backlog`) before sending more.
    """

    def __init__(
        self,
        commit: Callable[[Mapping[str, Row]], None],
        *,
        window: float = DEFAULT_WINDOW,
        max_rows: int = DEFAULT_MAX_ROWS,
        backlog: int = DEFAULT_BACKLOG,
    ) -> None:
        self._commit, self.window, self.max_rows = commit, window, max_rows
        self.backlog = Gate(backlog)  # results queued, not yet committed: a run waits while it is full
        # `put` takes the plain lock (a C call, once per result on the loop); the condition shares it.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiting: dict[str, Row] = {}
        self._writing: Mapping[str, Row] = {}  # the group being committed, readable until it is
        self._first = 0.0  # when the oldest waiting result arrived
        self._flushes = 0  # callers of `flush` waiting: commit without waiting for the window
        self._closing = False
        self._thread: threading.Thread | None = None

    def put(self, key: str, row: Row) -> None:
        """Queue a result for the next group; never blocks on SQLite."""
        with self._lock:
            waiting = self._waiting  # read under the lock: the writer's thread swaps it for a new group
            if self._closing:
                raise RuntimeError("the response cache is closed")
            if not waiting:
                self._first = time.monotonic()
                self._start()
                self._changed.notify_all()
            elif key in waiting:
                waiting[key] = row
                return  # counted once per waiting entry, as its group will be
            waiting[key] = row
            self.backlog.delivered_one()
            if len(waiting) == self.max_rows:
                self._changed.notify_all()

    def get(self, key: str) -> Row | None:
        """A result queued or being committed (``None`` once committed: read it from the file)."""
        with self._changed:
            return self._waiting.get(key) or self._writing.get(key)

    def get_many(self, keys: Iterable[str]) -> dict[str, Row]:
        """`get` for each of ``keys``, those found."""
        with self._changed:
            if not self._waiting and not self._writing:
                return {}
            found = {k: row for k in keys if (row := self._waiting.get(k) or self._writing.get(k))}
        return found

    def idle(self) -> bool:
        """Whether nothing waits or is being committed."""
        with self._changed:
            return not self._waiting and not self._writing

    def flush(self) -> None:
        """Block until every result queued before this call is committed (or its commit failed)."""
        with self._changed:
            if not self._waiting and not self._writing:
                return
            self._flushes += 1
            self._changed.notify_all()
            try:
                self._changed.wait_for(lambda: not self._waiting and not self._writing)
            finally:
                self._flushes -= 1

    def close(self) -> None:
        """Commit what waits, then stop the thread (idempotent)."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="asyncbackends-cache-writer", daemon=True)
            self._thread.start()

    def _due(self) -> bool:
        return (
            self._closing
            or self._flushes > 0
            or len(self._waiting) >= self.max_rows
            or time.monotonic() - self._first >= self.window
        )

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._waiting and not self._closing:
                    self._changed.wait()
                if not self._waiting:  # closing, nothing left
                    return
                while not self._due():
                    self._changed.wait(max(0.0, self._first + self.window - time.monotonic()))
                group, self._waiting = self._waiting, {}
                self._writing = group
            try:
                self._commit(group)
            except Exception as exc:  # a full disk or a locked file: the run goes on, a resume re-sends
                log.warning("response cache: a group of %d results was not stored: %s", len(group), exc)
            with self._changed:
                self._writing = {}
                self._changed.notify_all()
            self.backlog.took(len(group))
