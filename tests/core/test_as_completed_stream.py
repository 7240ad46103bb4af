"""`as_completed` over a generator: taken one request per freed slot, never held whole, resumable.

The reference for every result is the list form (`gather` over the same requests) and the mock backend's own
attempt counters (what was really sent); the bound is read from counters the generator and the reader
keep, never from timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._cache_writer import GroupWriter
from asyncbackends._run_cache import CHUNK
from asyncbackends.adapters.mock import MockBackend

CONCURRENCY = 8


class Counted:
    """A generator of ``n`` requests that counts how many were taken from it."""

    def __init__(self, n: int, *, fail_at: int | None = None) -> None:
        self.n, self.fail_at, self.taken = n, fail_at, 0

    def __iter__(self) -> Iterator[ab.GenerationRequest]:
        for i in range(self.n):
            if i == self.fail_at:
                raise RuntimeError(f"the source broke at {i}")
            self.taken += 1
            yield ab.GenerationRequest(f"p{i}", request_id=f"p{i}")


def listed(n: int) -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"p{i}", request_id=f"p{i}") for i in range(n)]


async def read_all(
    backend: Any, source: Counted, *, stall_at: int = -1, **options: Any
) -> tuple[list[tuple[int, Any]], int]:
    """Every ``(index, outcome)``, and the most requests ever taken from ``source`` and not yet read back.

    At ``stall_at`` results the reader stops reading for 500 turns of the loop (no wall clock: a mock of
    no latency ends a request in two turns), so a run not held back by its reader would take hundreds more.
    """
    seen: list[tuple[int, Any]] = []
    ahead = 0
    generator: Any = ab.as_completed(backend, iter(source), concurrency=CONCURRENCY, **options)
    async with contextlib.aclosing(generator) as items:
        async for item in items:
            seen.append(item)
            ahead = max(ahead, source.taken - len(seen))
            if len(seen) == stall_at:
                for _ in range(500):
                    await asyncio.sleep(0)
                ahead = max(ahead, source.taken - len(seen))
    return seen, ahead


def reference(backend: Any, n: int) -> list[str]:
    """The texts of the list form: `run_batch` over the same requests."""
    return [
        result.text for result in ab.run_batch(backend, listed(n)) if isinstance(result, ab.GenerationResult)
    ]


def texts(items: list[tuple[int, Any]]) -> list[str]:
    indices = [index for index, _ in items]
    assert len(indices) == len(set(indices)), "an index yielded twice"
    return [outcome.text for _, outcome in sorted(items, key=lambda item: item[0])]


def test_a_generator_is_taken_one_request_per_freed_slot(make_mock: Any) -> None:
    # On the shared loop itself, so the stalled reader and the run take turns on one loop, deterministically.
    backend = make_mock()
    source = Counted(3000)
    items, ahead = ab.get_loop_manager().run(read_all(backend, source, stall_at=100))
    # Held at once: a request per worker, and up to a bound of results delivered and unread (the concurrency,
    # exceeded by at most what the workers already sending deliver).
    assert ahead <= 3 * CONCURRENCY
    assert texts(items) == reference(make_mock(), 3000)
    assert sum(backend.attempts.values()) == 3000 and backend.max_in_flight <= CONCURRENCY


def test_a_generator_read_from_another_loop_equals_the_list_form(make_mock: Any) -> None:
    backend = make_mock(latency=0.001, jitter=0.002)
    metrics = ab.RunMetrics()
    items, ahead = asyncio.run(read_all(backend, Counted(500), metrics=metrics))
    assert ahead <= 3 * CONCURRENCY
    assert texts(items) == reference(make_mock(), 500)
    assert metrics.requests == 500 and metrics.successes == 500  # counted as taken: no total up front


def test_an_empty_generator_ends_at_once(make_mock: Any) -> None:
    backend = make_mock()
    items, _ = asyncio.run(read_all(backend, Counted(0)))
    assert items == [] and sum(backend.attempts.values()) == 0


def test_a_stream_of_unknown_length_shows_a_bar_counting_up(
    make_mock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    items, _ = asyncio.run(read_all(make_mock(), Counted(40), progress="streamed"))
    err = capsys.readouterr().err
    assert len(items) == 40 and "streamed" in err and "40req" in err.replace(" ", "")
    assert "40/" not in err  # no total: tqdm counts up


def test_a_resume_from_the_cache_sends_nothing_and_streams_its_hits(make_mock: Any, tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    n = 3 * CHUNK + 17
    first, _ = asyncio.run(read_all(make_mock(), Counted(n), cache=path))
    resumed_backend: MockBackend = make_mock()
    metrics = ab.RunMetrics()
    source = Counted(n)
    resumed, ahead = ab.get_loop_manager().run(
        read_all(resumed_backend, source, stall_at=100, cache=path, metrics=metrics)
    )
    assert sum(resumed_backend.attempts.values()) == 0 and metrics.cache_hits == n
    assert texts(resumed) == texts(first) == reference(make_mock(), n)
    # Hits are delivered as the workers take them, paused while the reader holds the bound unread: a resume
    # reads two lookup chunks ahead (one looked up on the cache's reader thread while the other is handed
    # on), never the whole file into the reader's queue.
    assert ahead <= 3 * CONCURRENCY + 2 * CHUNK


@pytest.mark.parametrize("fail_at", [CHUNK - 5, CHUNK + 88, 2 * CHUNK])
def test_a_source_raising_after_cached_requests_delivers_each_of_them_first(
    make_mock: Any, tmp_path: Path, fail_at: int
) -> None:
    # A file that holds results is looked up two chunks ahead (one on the cache's reader thread): the
    # chunk the source broke in, and the one before it, are still delivered before its error.
    path = tmp_path / "run.sqlite"
    first, _ = asyncio.run(read_all(make_mock(), Counted(3 * CHUNK), cache=path))
    backend: MockBackend = make_mock()
    seen: list[tuple[int, Any]] = []

    async def resumed() -> None:
        generator: Any = ab.as_completed(
            backend, iter(Counted(3 * CHUNK, fail_at=fail_at)), concurrency=CONCURRENCY, cache=path
        )
        async with contextlib.aclosing(generator) as items:
            async for item in items:
                seen.append(item)

    with pytest.raises(RuntimeError, match=f"the source broke at {fail_at}"):
        asyncio.run(resumed())
    assert sorted(index for index, _ in seen) == list(range(fail_at))  # every one, each once
    assert texts(seen) == texts(first)[:fail_at]
    assert sum(backend.attempts.values()) == 0  # all of them from the file


@pytest.mark.parametrize("how", ["the source raises", "the reader leaves"])
def test_a_stream_ended_midway_loses_nothing(make_mock: Any, tmp_path: Path, how: str) -> None:
    path = tmp_path / "run.sqlite"
    n = 2 * CHUNK + 50
    backend = make_mock(latency=0.001)

    async def first_run() -> list[tuple[int, Any]]:
        seen: list[tuple[int, Any]] = []
        source = Counted(n, fail_at=CHUNK + 100 if how == "the source raises" else None)
        generator: Any = ab.as_completed(backend, iter(source), concurrency=CONCURRENCY, cache=path)
        with contextlib.suppress(RuntimeError):
            async with contextlib.aclosing(generator) as items:
                async for item in items:
                    seen.append(item)
                    if how == "the reader leaves" and len(seen) == CHUNK + 100:
                        break
        return seen

    seen = asyncio.run(first_run())
    assert 0 < len(seen) < n and len({index for index, _ in seen}) == len(seen)
    assert backend.in_flight == 0  # what was in flight was cancelled before the run returned
    # Resumed: every result the first run delivered comes from the cache; exactly the rest is sent.
    again: MockBackend = make_mock()
    metrics = ab.RunMetrics()
    resumed, _ = asyncio.run(read_all(again, Counted(n), cache=path, metrics=metrics))
    sent = {key for key, count in again.attempts.items() if count}
    assert metrics.cache_hits >= len(seen) and sum(again.attempts.values()) == n - metrics.cache_hits
    assert not sent & {f"p{index}" for index, _ in seen}
    assert texts(resumed) == reference(make_mock(), n)


def test_an_error_mid_stream_is_raised_after_the_results_before_it(make_mock: Any) -> None:
    backend = make_mock()

    async def main() -> tuple[int, BaseException | None]:
        seen = 0
        try:
            async for _ in ab.as_completed(backend, iter(Counted(100, fail_at=60)), concurrency=4):
                seen += 1
        except RuntimeError as exc:
            return seen, exc
        return seen, None

    seen, error = asyncio.run(main())
    assert isinstance(error, RuntimeError) and "broke at 60" in str(error)
    assert seen <= 60 and backend.in_flight == 0


def test_a_run_waits_for_a_cache_writer_that_falls_behind(make_mock: Any, tmp_path: Path) -> None:
    # The writer's commit is held until released: results queued and not committed reach the backlog's
    # bound, and the run sends nothing more instead of holding ever more results in memory.
    cache = ab.ResponseCache(tmp_path / "run.sqlite")
    release, entered = threading.Event(), threading.Event()

    def held_commit(group: Any) -> None:
        entered.set()
        release.wait()
        cache._commit_group(group)

    cache._writer = GroupWriter(held_commit, backlog=50)
    backend = make_mock()
    outcome: list[Any] = []
    runner = threading.Thread(
        target=lambda: outcome.append(
            ab.run_batch(backend, listed(2000), cache=cache, concurrency=CONCURRENCY)
        )
    )
    runner.start()
    try:
        assert entered.wait(60)
        deadline = time.monotonic() + 60
        while not cache.backlog._waiters and time.monotonic() < deadline:  # state, polled: a worker waits
            time.sleep(0.01)
        assert cache.backlog._waiters, "no worker waited for the writer"
        assert sum(backend.attempts.values()) <= 50 + CONCURRENCY
    finally:
        release.set()
        runner.join(60)
    assert [r.text for r in outcome[0]] == reference(make_mock(), 2000)
    assert len(cache) == 2000
    cache.close()
