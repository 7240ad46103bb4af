"""`ResponseCache`: a resumable SQLite cache of results, written as they arrive.

``gather(..., cache="run.sqlite")`` looks its requests up a chunk at a time before sending them and stores
each result with the next group commit (`_cache_writer`: within 50 ms, on a thread), so a run killed at any
instant resumes by sending only what is missing, at most the last window's results again. Errors are never
stored. The key is the backend's fingerprint (adapter, model and the options that change outputs, never a
secret) plus the canonical request without its id (`_cache_codec`). Unseeded sampling is not reproducible,
so it is cached only when asked for (``cache_unseeded=True``). The file is created with mode 0600 and opened
in WAL mode, so readers (``asyncbackends cache stats``) never block the writer. Provider batches in flight
are recorded beside the results (`BatchRecord`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ._cache_admin import CacheAdmin
from ._cache_batches import BATCH_SCHEMA, BatchRecords
from ._cache_batches import BatchRecord as BatchRecord  # where abc.py and earlier code import it
from ._cache_codec import backend_fingerprint as backend_fingerprint  # imported from here by adapters' tests
from ._cache_codec import (
    decode_result,
    encode_result,
    request_key,
)
from ._cache_writer import GroupWriter, Row
from ._protocol import AsyncBackend
from ._run_feed import Gate
from ._types import GenerationRequest, Request, Result
from .errors import InvalidRequestError

__all__ = ["CacheReadWarning", "ResponseCache", "open_cache"]

log = logging.getLogger(__name__)

# SQLite's default limit on one statement's parameters is 32,766 (since 3.32); well under it.
_KEYS_PER_QUERY = 500

# A chunk's rows as one text, made by SQLite in one step: the Python module releases the GIL for each step,
# so a lookup on the reader thread runs beside the loop only if it is one step, not one per row. The
# separators (ASCII RS between rows, US between fields) never appear raw in what we store (hex keys, class
# names, JSON written with ensure_ascii); a file whose rows do not split as counted is read row by row.
_LOOKUP = (
    "SELECT count(*), group_concat(key || char(31) || kind || char(31) || value, char(30)) "
    "FROM results WHERE key IN ({})"
)
_LOOKUP_ROWS = "SELECT key, kind, value FROM results WHERE key IN ({})"

_INSERT = "INSERT OR REPLACE INTO results (key, kind, value, backend) VALUES "
_ROWS_PER_INSERT = 200  # 800 parameters: under the 999 of SQLite before 3.32 too

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    backend TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL DEFAULT (julianday('now'))
)
"""


class CacheReadWarning(RuntimeWarning):
    """A stored result could not be read back, so its request is sent again.

    Warned once per cache and cause (the first entry's error named), with the running count in
    `ResponseCache.read_failures` and in `RunMetrics.cache_read_failures`: a resume that re-sends a whole
    run shows as such, not as one quiet log line among many.
    """


class ResponseCache(BatchRecords, CacheAdmin):
    """A SQLite file of results keyed by backend fingerprint and canonical request.

    Safe to share between threads and runs; one process writes at a time.

    Args:
        path: The SQLite file; created (mode 0600) with its parent folder when missing.
        cache_unseeded: Also cache sampling without a seed (not reproducible, so off by default).
    """

    def __init__(self, path: str | os.PathLike[str], *, cache_unseeded: bool = False) -> None:
        self.path = Path(path)
        self.cache_unseeded = cache_unseeded
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            # Create it private before SQLite does: results can hold prompts nobody else should read.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        os.chmod(self.path, 0o600)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a killed process (only a power cut can lose the last commits).
        self._db.execute("PRAGMA synchronous=NORMAL")
        # Checkpoint the WAL into the file every ~40 MB instead of SQLite's 4 MB: each checkpoint syncs the
        # file, and a group of random keys rewrites most of the key index's pages, so at 4 MB a new cache's
        # writer spent much of its time in checkpoints (the WAL is removed when the file is closed).
        self._db.execute("PRAGMA wal_autocheckpoint=10000")
        self._db.execute(_SCHEMA)
        self._db.execute(BATCH_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(batches)")}
        if "requests" not in columns:  # a file written before records kept their requests
            self._db.execute("ALTER TABLE batches ADD COLUMN requests TEXT")
        self.read_failures = 0
        self._warned: set[str] = set()
        self._writer = GroupWriter(self._commit_group)
        self._reader: ThreadPoolExecutor | None = None  # made by the first `lookup`
        self._reader_lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.path)!r})"

    def cacheable(self, request: Request) -> bool:
        """Whether ``request`` is reproducible enough to cache (or unseeded caching was asked for)."""
        if isinstance(request, GenerationRequest):
            params = request.params
            return params.greedy or params.seed is not None or self.cache_unseeded
        return True

    def key(self, backend: AsyncBackend, request: Request) -> str:
        """The cache key of ``request`` sent to ``backend`` (a SHA-256 hex digest)."""
        return request_key(backend, request)

    def get(self, backend: AsyncBackend, request: Request) -> Result | None:
        """The stored result for ``request``, with its ``request_id`` set to the request's, or ``None``."""
        if not self.cacheable(request):
            return None
        found = self.stored([self.key(backend, request)])
        return next((decode_result(kind, value, request.request_id) for kind, value in found.values()), None)

    def stored(self, keys: Sequence[str], *, queued_only: bool = False) -> dict[str, tuple[str, str]]:
        """The stored ``(kind, value)`` of each of ``keys`` found, queued results included.

        One query per chunk of keys (a set lookup), so a resume reads its cached part at the speed SQLite
        reads rows, not at one round trip per request. ``queued_only``: look among the results waiting
        for their commit only (a run that started on an empty file).
        """
        # Queued only: nothing to read from the file, so no wait for its lock (the writer holds it while it
        # commits a group, tens of ms, which stalled a new cache's run at every chunk's lookup).
        found = {} if queued_only else self._stored_in_file(keys)
        for key, (result, _) in self._writer.get_many(keys).items():
            found[key] = encode_result(result)
        return found

    def _stored_in_file(self, keys: Sequence[str]) -> dict[str, tuple[str, str]]:
        found: dict[str, tuple[str, str]] = {}
        for start in range(0, len(keys), _KEYS_PER_QUERY):
            chunk = keys[start : start + _KEYS_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            with self._lock:
                try:
                    count, text = self._db.execute(_LOOKUP.format(marks), chunk).fetchone()
                    rows = _split_rows(count, text)
                except sqlite3.Error:
                    # A value that is not UTF-8 text, or a chunk too long for one string (SQLite's length
                    # limit, 1e9 bytes): read row by row, which raises again if the file itself is broken.
                    rows = None
                if rows is None:
                    rows = self._db.execute(_LOOKUP_ROWS.format(marks), chunk).fetchall()
            for key, kind, value in rows:
                found[key] = (kind, value)
        return found

    def lookup(self, keys: Sequence[str]) -> Future[dict[str, tuple[str, str]]]:
        """`stored` on the cache's reader thread: a run decodes a chunk while SQLite reads the next."""
        # Its own lock, not the file's: the writer holds that through each group's commit.
        with self._reader_lock:
            if self._reader is None and not self._closed:
                self._reader = ThreadPoolExecutor(1, thread_name_prefix="asyncbackends-cache-reader")
            reader = self._reader
        if reader is not None:
            with contextlib.suppress(RuntimeError):  # shut down by a `close` since: looked up here instead
                return reader.submit(self.stored, keys)
        looked_up: Future[dict[str, tuple[str, str]]] = Future()
        try:
            looked_up.set_result(self.stored(keys))
        except sqlite3.Error as exc:  # closed: the caller counts each key as a failed read, as before
            looked_up.set_exception(exc)
        return looked_up

    def empty(self) -> bool:
        """Whether no result is stored or queued."""
        with self._lock:
            row = self._db.execute("SELECT 1 FROM results LIMIT 1").fetchone()
        return row is None and self._writer.idle()

    def put(self, backend: AsyncBackend, request: Request, result: Result) -> None:
        """Store ``result`` for ``request`` in its own committed transaction."""
        if not self.cacheable(request):
            return
        kind, value = encode_result(result)
        name = backend.name
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO results (key, kind, backend, value) VALUES (?, ?, ?, ?)",
                (self.key(backend, request), kind, name, value),
            )

    def queue(self, key: str, backend_name: str, result: Result) -> None:
        """Store ``result`` under ``key`` with the next group commit (within 50 ms).

        Never waits for SQLite: the group is committed on the cache's writer thread.
        """
        try:
            self._writer.put(key, (result, backend_name))
        except RuntimeError as exc:  # closed under a run: as a failed write, the caller still gets it
            log.warning("response cache %s: write failed: %s", self.path, exc)

    @property
    def backlog(self) -> Gate:
        """Results queued and not yet committed: a run sends nothing new while it is full."""
        return self._writer.backlog

    def flush(self) -> None:
        """Block until every queued result is committed."""
        self._writer.flush()

    def _commit_group(self, group: Mapping[str, Row]) -> None:
        # In key order: the primary key's B-tree is then written page by page, not at random (a group of
        # 5,000 into a 1M-entry file: 21 us a row instead of 33 here).
        rows = sorted((key, *encode_result(result), name) for key, (result, name) in group.items())
        with self._lock, self._transaction():
            self._insert(rows)

    def _insert(self, rows: Sequence[tuple[str, str, str, str]]) -> None:
        """Insert ``(key, kind, value, backend)`` rows, `_ROWS_PER_INSERT` a statement (in a transaction)."""
        # One statement per row (executemany) releases and retakes the GIL for every row, and on the writer's
        # thread each retake waits for the loop's thread to let go: a statement of many rows waits once.
        for start in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = rows[start : start + _ROWS_PER_INSERT]
            self._db.execute(
                _INSERT + ",".join(["(?, ?, ?, ?)"] * len(chunk)), [field for row in chunk for field in row]
            )

    def read(self, kind: str, value: str, request_id: str | None) -> Result | None:
        """A stored row as a result with ``request_id``, or ``None`` (counted and warned) if unreadable."""
        try:
            return decode_result(kind, value, request_id)
        except (ValueError, KeyError, TypeError, InvalidRequestError) as exc:
            self.read_failed(exc)
            return None

    def read_failed(self, exc: Exception) -> None:
        """Count a stored result that could not be read (its request is sent again); warn once per cause."""
        self.read_failures += 1
        cause = f"{type(exc).__name__}: {exc}"
        log.debug("response cache %s: read failed, sending the request: %s", self.path, cause)
        if type(exc).__name__ not in self._warned:
            self._warned.add(type(exc).__name__)
            warnings.warn(
                CacheReadWarning(
                    f"response cache {self.path}: a stored result could not be read ({cause}); its "
                    "request is sent again, and so is every other entry failing this way (counted in "
                    "ResponseCache.read_failures and RunMetrics.cache_read_failures)"
                ),
                stacklevel=3,
            )

    def put_many(self, backend: AsyncBackend, pairs: Iterable[tuple[Request, Result]]) -> None:
        """Store several results in one committed transaction (a provider batch's, read back at once).

        One commit instead of one per result: a 20,000-request batch took 10.8 s to store one by one here.
        """
        self._store(backend, pairs, forget=None)

    def _store(
        self, backend: AsyncBackend, pairs: Iterable[tuple[Request, Result]], forget: str | None
    ) -> None:
        rows = [
            (request_key(backend, request), *encode_result(result), backend.name)
            for request, result in pairs
            if self.cacheable(request)
        ]
        with self._lock, self._transaction():
            self._insert(rows)
            if forget is not None:
                self._db.execute("DELETE FROM batches WHERE file_id = ?", (forget,))

    async def aget(self, backend: AsyncBackend, request: Request) -> Result | None:
        """Async form of `get`: an unreadable entry or database is a miss.

        Each miss of that kind counts in `read_failures`; the first of each cause warns with
        `CacheReadWarning` naming it, since it means requests already paid for are sent again.
        """
        try:
            return self.get(backend, request)
        except (sqlite3.Error, ValueError, KeyError, TypeError, InvalidRequestError) as exc:
            self.read_failed(exc)
            return None

    async def aput(self, backend: AsyncBackend, request: Request, result: Result) -> None:
        """Async form of `put`, committed with the next group (`queue`), as `gather` stores results.

        A failed write (disk full, database locked) is logged and the result still goes to the caller; only
        a resume would send that request again.
        """
        if self.cacheable(request):
            self.queue(self.key(backend, request), backend.name, result)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def stats(self) -> dict[str, Any]:
        """Entries by backend and kind, provider batches still recorded as in flight, the file's size."""
        self.flush()
        with self._lock:
            rows = self._db.execute(
                "SELECT backend, kind, COUNT(*) FROM results GROUP BY backend, kind ORDER BY backend, kind"
            ).fetchall()
            batches = int(self._db.execute("SELECT COUNT(*) FROM batches").fetchone()[0])
        return {
            "path": str(self.path),
            "entries": sum(r[2] for r in rows),
            "by_backend": [{"backend": r[0], "kind": r[1], "entries": r[2]} for r in rows],
            "batches_in_flight": batches,
            "bytes": self.path.stat().st_size,
        }

    def __len__(self) -> int:
        self.flush()
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def clear(self) -> int:
        """Delete every entry and batch record (a cleared cache resumes nothing); returns the entries."""
        self.flush()
        with self._lock:
            count = int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])
            self._db.execute("DELETE FROM results")
            self._db.execute("DELETE FROM batches")
            with contextlib.suppress(sqlite3.OperationalError):
                self._db.execute("VACUUM")
        return count

    def close(self) -> None:
        """Commit what is queued, end the lookups under way, then close the database connection."""
        self._writer.close()
        with self._reader_lock:
            reader, self._reader, self._closed = self._reader, None, True
        if reader is not None:
            reader.shutdown(wait=True)
        with self._lock:
            self._db.close()


def _split_rows(count: int, text: str | None) -> list[tuple[str, str, str]] | None:
    """The rows `_LOOKUP` joined, or ``None`` where they do not split into ``count`` rows of three fields."""
    if not count:
        return []
    if text is None:
        return None  # a NULL value left its row out of the text
    items = text.split("\x1e")
    if len(items) != count:
        return None
    rows = []
    for item in items:
        fields = item.split("\x1f", 2)
        if len(fields) != 3:
            return None
        rows.append((fields[0], fields[1], fields[2]))
    return rows


def open_cache(cache: ResponseCache | str | os.PathLike[str]) -> ResponseCache:
    """A `ResponseCache` from a cache object or a path.

    Raises:
        InvalidRequestError: ``cache`` is neither.
    """
    if isinstance(cache, ResponseCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return ResponseCache(cache)
    raise InvalidRequestError(f"cache must be a ResponseCache or a path, got {type(cache).__name__}")
