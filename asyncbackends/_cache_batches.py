"""Provider batches in flight, as the response cache records them (`BatchRecord`, `BatchRecords`).

``gather(..., batch=True)`` records each uploaded input file (and its batch id once created) beside the
results, with the requests of its lines, so a restarted run polls the batch instead of sending its requests
again, and reads every answer in it, whichever run's requests they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ._cache_codec import decode_request, encode_request, fingerprint_key
from ._protocol import AsyncBackend
from ._types import GenerationRequest, Request, Result
from .errors import InvalidRequestError

__all__ = ["BATCH_SCHEMA", "BatchRecord", "BatchRecords", "custom_id_key"]

log = logging.getLogger(__name__)

# Provider batches in flight (``gather(..., batch=True)``): one row per uploaded input file, its batch id
# once created, so a restarted run polls them instead of sending their requests again.
BATCH_SCHEMA = """
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


class BatchRecords:
    """The `ResponseCache` methods that keep provider batches in flight (a mixin of it)."""

    if TYPE_CHECKING:  # provided by ResponseCache
        _lock: threading.Lock
        _db: sqlite3.Connection

        def _transaction(self) -> contextlib.AbstractContextManager[None]: ...

        def _store(
            self, backend: AsyncBackend, pairs: Iterable[tuple[Request, Result]], forget: str | None
        ) -> None: ...

        def stored(self, keys: Sequence[str]) -> dict[str, tuple[str, str]]: ...

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
        return set(self.stored(list(keys)))
