"""`ResponseCache`: a resumable SQLite cache of results, written as they arrive.

``gather(..., cache="run.sqlite")`` looks each request up before sending it and stores each result in its own
committed transaction the moment it arrives, so a run killed at any instant resumes by sending only what is
missing. Errors are never stored. The key is the backend's fingerprint (adapter, model and the options that
change outputs, never a secret) plus the canonical request without its id. Unseeded sampling is not
reproducible, so it is cached only when asked for (``cache_unseeded=True``). The file is created with mode
0600 and opened in WAL mode, so readers (``asyncbackends cache stats``) never block the writer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sqlite3
import threading
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ._cache_codec import (
    backend_fingerprint,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
    fingerprint_key,
    request_key,
)
from ._protocol import AsyncBackend
from ._types import GenerationRequest, Request, Result
from .errors import InvalidRequestError

__all__ = [
    "BatchRecord",
    "CacheReadWarning",
    "ResponseCache",
    "backend_fingerprint",
    "open_cache",
    "request_key",
]

log = logging.getLogger(__name__)

# SQLite's default limit on one statement's parameters is 32,766 (since 3.32); well under it.
_KEYS_PER_QUERY = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    backend TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL DEFAULT (julianday('now'))
)
"""

# Provider batches in flight (``gather(..., batch=True)``): one row per uploaded input file, its batch id
# once created, so a restarted run polls them instead of sending their requests again.
_BATCH_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    file_id TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    batch_id TEXT,
    custom_ids TEXT NOT NULL,
    created REAL NOT NULL DEFAULT (julianday('now')),
    requests TEXT
)
"""


@dataclasses.dataclass(frozen=True, slots=True)
class BatchRecord:
    """A provider batch a run started and has not read back yet.

    Args:
        file_id: The uploaded input file.
        endpoint: The batch's endpoint.
        batch_id: The batch, once created (``None``: killed between uploading and recording the batch).
        custom_ids: The requests in it, in line order.
        requests: The request of each custom id, in the same order, so that any later run can read every
            answer the batch holds (not only its own requests'); empty in a record written before they were
            kept (such a batch's other answers cannot be read).
    """

    file_id: str
    endpoint: str
    batch_id: str | None
    custom_ids: tuple[str, ...]
    requests: tuple[GenerationRequest, ...] = ()


def _requests(stored: str | None, count: int) -> tuple[GenerationRequest, ...]:
    # Unreadable (or from an older file): the run reads only its own requests' answers, as it did then.
    if not stored:
        return ()
    try:
        requests = tuple(decode_request(d) for d in json.loads(stored))
    except (ValueError, KeyError, TypeError, InvalidRequestError) as exc:
        log.warning("response cache: a batch record's requests could not be read: %s", exc)
        return ()
    return requests if len(requests) == count else ()


def custom_id_key(custom_id: str) -> str:
    """The cache key inside a batch line's custom id (``"{key}-{occurrence}"``)."""
    return custom_id.rsplit("-", 1)[0]


class CacheReadWarning(RuntimeWarning):
    """A stored result could not be read back, so its request is sent again.

    Warned once per cache and cause (the first entry's error named), with the running count in
    `ResponseCache.read_failures` and in `RunMetrics.cache_read_failures`: a resume that re-sends a whole
    run shows as such, not as one quiet log line among many.
    """


class ResponseCache:
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
        self._db.execute(_SCHEMA)
        self._db.execute(_BATCH_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(batches)")}
        if "requests" not in columns:  # a file written before records kept their requests
            self._db.execute("ALTER TABLE batches ADD COLUMN requests TEXT")
        self.read_failures = 0
        self._warned: set[str] = set()

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
        with self._lock:
            row = self._db.execute(
                "SELECT kind, value FROM results WHERE key = ?", (self.key(backend, request),)
            ).fetchone()
        return None if row is None else decode_result(row[0], row[1], request.request_id)

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
            self._db.executemany(
                "INSERT OR REPLACE INTO results (key, kind, value, backend) VALUES (?, ?, ?, ?)", rows
            )
            if forget is not None:
                self._db.execute("DELETE FROM batches WHERE file_id = ?", (forget,))

    # Local SQLite reads and WAL commits take microseconds: doing them inline on the loop costs less than
    # a hop to a worker thread would.
    async def aget(self, backend: AsyncBackend, request: Request) -> Result | None:
        """Async form of `get`, as `gather` uses it: an unreadable entry or database is a miss.

        Each miss of that kind counts in `read_failures`; the first of each cause warns with
        `CacheReadWarning` naming it, since it means requests already paid for are sent again.
        """
        try:
            return self.get(backend, request)
        except (sqlite3.Error, ValueError, KeyError, TypeError, InvalidRequestError) as exc:
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
                    stacklevel=2,
                )
            return None

    async def aput(self, backend: AsyncBackend, request: Request, result: Result) -> None:
        """Async form of `put`, as `gather` uses it.

        A failed write (disk full, database locked) is logged and the result still goes to the caller; only
        a resume would send that request again.
        """
        try:
            self.put(backend, request, result)
        except sqlite3.Error as exc:
            log.warning("response cache %s: write failed: %s", self.path, exc)

    # -- provider batches in flight -----------------------------------------------------------------

    def batch_records(self, backend: AsyncBackend) -> list[BatchRecord]:
        """The batches of ``backend`` (by fingerprint) started and not yet read back, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT file_id, endpoint, batch_id, custom_ids, requests FROM batches WHERE fingerprint = ? "
                "ORDER BY created, rowid",
                (fingerprint_key(backend),),
            ).fetchall()
        return [
            BatchRecord(
                r[0],
                r[1],
                r[2],
                tuple(json.loads(r[3])),
                _requests(r[4], len(json.loads(r[3]))),
            )
            for r in rows
        ]

    def add_batch(self, backend: AsyncBackend, record: BatchRecord) -> None:
        """Record an uploaded input file (and its batch, once known) in its own committed transaction."""
        requests = json.dumps([encode_request(r) for r in record.requests]) if record.requests else None
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO batches "
                "(file_id, fingerprint, endpoint, batch_id, custom_ids, requests) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record.file_id,
                    fingerprint_key(backend),
                    record.endpoint,
                    record.batch_id,
                    json.dumps(record.custom_ids),
                    requests,
                ),
            )

    def set_batch_id(self, file_id: str, batch_id: str) -> None:
        """Record the batch started over a recorded input file, in its own committed transaction."""
        with self._lock:
            self._db.execute("UPDATE batches SET batch_id = ? WHERE file_id = ?", (batch_id, file_id))

    def remove_batch(self, file_id: str) -> None:
        """Forget a batch whose outcomes were read (its results are stored by then)."""
        with self._lock:
            self._db.execute("DELETE FROM batches WHERE file_id = ?", (file_id,))

    def store_batch(
        self, backend: AsyncBackend, file_id: str, pairs: Iterable[tuple[Request, Result]]
    ) -> None:
        """Store a finished batch's results and forget its record, in one committed transaction.

        One transaction, so a run killed at any instant leaves either the record (the next run reads the
        batch again) or the results (nothing to read): never a record whose answers are stored already.
        """
        self._store(backend, pairs, forget=file_id)

    def stored_keys(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` have a stored result (looked up as sets, a chunk of keys per query)."""
        found: set[str] = set()
        chunk: list[str] = []
        with self._lock:
            for key in keys:
                chunk.append(key)
                if len(chunk) == _KEYS_PER_QUERY:
                    found.update(self._present(chunk))
                    chunk = []
            if chunk:
                found.update(self._present(chunk))
        return found

    def _present(self, keys: list[str]) -> list[str]:
        marks = ",".join("?" * len(keys))
        rows = self._db.execute(f"SELECT key FROM results WHERE key IN ({marks})", keys).fetchall()
        return [r[0] for r in rows]

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
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def clear(self) -> int:
        """Delete every entry and batch record (a cleared cache resumes nothing); returns the entries."""
        with self._lock:
            count = int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])
            self._db.execute("DELETE FROM results")
            self._db.execute("DELETE FROM batches")
            with contextlib.suppress(sqlite3.OperationalError):
                self._db.execute("VACUUM")
        return count

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()


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
