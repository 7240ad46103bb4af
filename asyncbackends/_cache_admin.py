"""Exporting and pruning a response cache (`CacheAdmin`, a mixin of `ResponseCache`).

Both stream: an export writes one JSON line per entry as SQLite's cursor yields it (a 1M-entry file is never
held in memory), and a prune is one ``DELETE`` statement, so they stay quick on eval-sized files
(docs/benchmarks.md, "Cache administration"). A prune never touches provider batch records: a batch in
flight is paid for, and forgetting it would send its requests again.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import threading
from typing import TYPE_CHECKING, TextIO

from .errors import InvalidRequestError

__all__ = ["CacheAdmin"]

# Rows fetched from SQLite at a time while exporting: large enough that the per-call cost vanishes, small
# enough that memory stays flat.
_ROWS_PER_FETCH = 2_000


class CacheAdmin:
    """The `ResponseCache` methods that export and prune its entries (a mixin of it)."""

    if TYPE_CHECKING:  # provided by ResponseCache
        _lock: threading.Lock
        _db: sqlite3.Connection

        def flush(self) -> None: ...

        def _transaction(self) -> contextlib.AbstractContextManager[None]: ...

    def export(self, out: TextIO, *, backend: str | None = None) -> int:
        """Write every entry (or ``backend``'s) to ``out`` as JSON lines, in key order; returns the count.

        Each line is ``{"key", "backend", "kind", "created", "result"}``: ``created`` an ISO 8601 UTC time,
        ``result`` the stored result as the cache holds it (the form `gather` reads back).

        Args:
            out: A text stream to write to.
            backend: Only entries written through the backend of this name.
        """
        self.flush()
        query = "SELECT key, backend, kind, strftime('%Y-%m-%dT%H:%M:%fZ', created), value FROM results"
        params: tuple[str, ...] = ()
        if backend is not None:
            query, params = query + " WHERE backend = ?", (backend,)
        count = 0
        # A cursor of its own, read in chunks under the lock: writers wait for a chunk, not for the export.
        cursor = self._db.cursor()
        try:
            with self._lock:
                cursor.execute(query + " ORDER BY key", params)
            while True:
                with self._lock:
                    rows = cursor.fetchmany(_ROWS_PER_FETCH)
                if not rows:
                    break
                for key, name, kind, created, value in rows:
                    # The stored value is JSON already: written as it is, not decoded and encoded again.
                    head = json.dumps({"key": key, "backend": name, "kind": kind, "created": created})
                    out.write(f'{head[:-1]}, "result": {value}}}\n')
                count += len(rows)
        finally:
            cursor.close()
        return count

    def prune(self, *, older_than_days: float | None = None, backend: str | None = None) -> int:
        """Delete the entries older than ``older_than_days`` and/or written through ``backend``.

        Provider batch records stay (see the module's docstring). The file does not shrink until SQLite
        reuses the pages (``VACUUM`` it to shrink it now: `clear` does).

        Args:
            older_than_days: Delete entries stored more than this many days ago (fractions allowed).
            backend: Delete only entries written through the backend of this name.

        Returns:
            How many entries were deleted.

        Raises:
            InvalidRequestError: Neither condition given (use `clear` to delete everything), or a negative
                or non-finite age.
        """
        if older_than_days is None and backend is None:
            raise InvalidRequestError("prune needs older_than_days or backend (clear() deletes everything)")
        conditions: list[str] = []
        params: list[float | str] = []
        if older_than_days is not None:
            if isinstance(older_than_days, bool) or not isinstance(older_than_days, (int, float)):
                raise InvalidRequestError(f"older_than_days must be a number, got {older_than_days!r}")
            if not math.isfinite(older_than_days) or older_than_days < 0:
                raise InvalidRequestError(f"older_than_days must be >= 0, got {older_than_days!r}")
            conditions.append("created < julianday('now') - ?")
            params.append(float(older_than_days))
        if backend is not None:
            conditions.append("backend = ?")
            params.append(backend)
        self.flush()
        with self._lock, self._transaction():
            deleted = self._db.execute(
                "DELETE FROM results WHERE " + " AND ".join(conditions), params
            ).rowcount
        return int(deleted)
