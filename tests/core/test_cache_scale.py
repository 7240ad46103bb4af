"""The response cache at the gathering path's speed: results committed in groups, a resume read by sets.

What SQLite is asked is counted from its own trace of the statements it runs (``set_trace_callback``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import asyncbackends as ab
from asyncbackends._cache_writer import DEFAULT_WINDOW, GroupWriter, Row

N = 2_000


def requests(n: int = N) -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"prompt {i}", request_id=str(i)) for i in range(n)]


class Statements:
    """The statements a connection runs, as SQLite traces them (from any thread)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.seen: list[str] = []
        self._lock = threading.Lock()
        db.set_trace_callback(self._record)

    def _record(self, statement: str) -> None:
        with self._lock:
            self.seen.append(statement.strip().split()[0].upper())

    def transactions_writing(self) -> int:
        """Committed transactions that wrote: each BEGIN ... COMMIT, and each INSERT outside one."""
        count, inside = 0, False
        for verb in self.seen:
            if verb == "BEGIN":
                inside, count = True, count + 1
            elif verb in ("COMMIT", "ROLLBACK"):
                inside = False
            elif verb == "INSERT" and not inside:
                count += 1
        return count


def test_a_run_commits_its_results_in_groups_not_one_transaction_each(tmp_path: Path) -> None:
    cache = ab.ResponseCache(tmp_path / "run.sqlite")
    statements = Statements(cache._db)
    try:
        results = ab.run_batch(ab.create_backend("mock"), requests(), cache=cache, concurrency=64)
        transactions = statements.transactions_writing()
        assert len(cache) == N  # every result committed by the time the run returned
    finally:
        cache.close()
    assert [r.text for r in results] == [f"prompt {i}" for i in range(N)]
    assert 1 <= transactions <= N // 100, transactions  # one per result before groups: 2,000


def test_a_resumed_run_reads_its_cached_part_a_chunk_of_keys_per_query(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    backend = ab.create_backend("mock")
    first = ab.run_batch(backend, requests(), cache=path)
    cache = ab.ResponseCache(path)
    statements = Statements(cache._db)
    metrics = ab.RunMetrics()
    try:
        again = ab.run_batch(backend, requests(), cache=cache, metrics=metrics)
    finally:
        cache.close()
    assert again == first and metrics.cache_hits == N
    assert sum(backend.attempts.values()) == N  # the first run's only
    assert 1 <= statements.seen.count("SELECT") <= N // 100  # one per request before: 2,000


def test_a_queued_result_is_committed_within_the_window_without_a_flush(tmp_path: Path) -> None:
    committed: list[tuple[float, int]] = []
    done = threading.Event()

    def commit(group: dict[str, Row]) -> None:
        committed.append((time.monotonic(), len(group)))
        done.set()

    writer = GroupWriter(commit, window=DEFAULT_WINDOW)  # type: ignore[arg-type]
    result = ab.GenerationResult("x", (ab.Completion("x"),))
    try:
        queued = time.monotonic()
        for i in range(3):
            writer.put(f"k{i}", (result, "mock"))
        assert writer.get("k1") == (result, "mock")  # readable while it waits
        assert done.wait(30)
    finally:
        writer.close()
    when, size = committed[0]
    assert size == 3 and when - queued >= DEFAULT_WINDOW  # grouped: waited for the window, not flushed
