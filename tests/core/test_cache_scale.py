"""The response cache at the gathering path's speed: results committed in groups, a resume read by sets.

What SQLite is asked is counted from its own trace of the statements it runs (``set_trace_callback``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncbackends as ab
import asyncbackends.abc
from asyncbackends._cache_codec import Keyer
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


def digest_as_files_hold_it(backend: ab.abc.AsyncBackend, request: Any) -> str:
    """The key as the first cache files were written: ``dataclasses.asdict`` of the request, id left out."""
    data = dataclasses.asdict(request)
    data.pop("request_id")
    data["type"] = type(request).__name__
    if not data["tools"]:
        data.pop("tools")
    if data["tool_choice"] == "auto":
        data.pop("tool_choice")
    if data["adapter"] is None:  # no adapter then: the base model's keys are those files' keys
        data.pop("adapter")
    fingerprint = dict(backend.fingerprint)  # type: ignore[attr-defined]
    return hashlib.sha256(json.dumps([fingerprint, data], sort_keys=True, default=str).encode()).hexdigest()


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.one_of(st.text(min_size=1), st.lists(st.integers(0, 2**31), min_size=1, max_size=20)),
    max_tokens=st.integers(0, 4096),
    temperature=st.sampled_from([0, 0.0, 0.7, 1, 1.5]),
    stop=st.lists(st.text(min_size=1, max_size=5), max_size=3).map(tuple),
    seed=st.one_of(st.none(), st.integers(0, 2**31)),
    penalty=st.one_of(st.none(), st.floats(-2, 2, allow_nan=False)),
    schema=st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3)),
    tool_choice=st.sampled_from(["auto", "none"]),
    adapter=st.one_of(st.none(), st.sampled_from(["math-v3", "a b", "é"])),
)
def test_text_and_token_keys_are_the_digests_files_hold(
    prompt: Any,
    max_tokens: int,
    temperature: float,
    stop: tuple[str, ...],
    seed: int | None,
    penalty: float | None,
    schema: dict[str, int] | None,
    tool_choice: str,
    adapter: str | None,
) -> None:
    params = ab.SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        stop=stop,
        seed=seed,
        presence_penalty=penalty,
        json_schema=schema,
    )
    request = ab.GenerationRequest(
        prompt, params, request_id="ignored", tool_choice=tool_choice, adapter=adapter
    )
    backend = ab.create_backend("mock")
    keyer = Keyer(backend)
    expected = digest_as_files_hold_it(backend, request)
    assert keyer(request) == expected
    assert keyer(request) == expected  # the params' JSON kept from the first call


def test_a_result_queued_on_a_closed_cache_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    cache.close()
    cache.queue("k", "mock", ab.GenerationResult("x", (ab.Completion("x"),)))  # as a run's worker would
    assert "write failed" in caplog.text
