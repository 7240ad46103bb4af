"""`ResponseCache.export` and `prune`: what a user keeps, moves and trims of a cache file."""

from __future__ import annotations

import io
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

import asyncbackends as ab
from asyncbackends._cache_codec import decode_result


def filled(tmp_path: Path) -> tuple[Path, list[ab.Result], list[ab.Result]]:
    path = tmp_path / "cache.sqlite"
    mock = ab.create_backend("mock")
    other = ab.create_backend("mock", model="other")
    other.name = "other-mock"  # type: ignore[misc]  # a second backend name in one file
    texts = ab.run_batch(mock, [ab.GenerationRequest(f"prompt {i}") for i in range(50)], cache=path)
    scores = ab.run_batch(other, [ab.LoglikelihoodRequest(f"c{i}", " x") for i in range(20)], cache=path)
    return path, texts, scores


def test_export_writes_every_entry_as_a_json_line_that_reads_back_equal(tmp_path: Path) -> None:
    path, texts, scores = filled(tmp_path)
    out = io.StringIO()
    with closing(ab.ResponseCache(path)) as cache:
        count = cache.export(out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert count == len(lines) == 70
    assert [line["key"] for line in lines] == sorted(line["key"] for line in lines)
    assert {line["backend"] for line in lines} == {"mock", "other-mock"}
    read = [decode_result(line["kind"], json.dumps(line["result"]), None) for line in lines]
    assert sorted(map(repr, read)) == sorted(repr(r) for r in [*texts, *scores])
    assert all(line["created"].endswith("Z") and line["created"][:4].isdigit() for line in lines)


def test_export_of_one_backend(tmp_path: Path) -> None:
    path, _, scores = filled(tmp_path)
    out = io.StringIO()
    with closing(ab.ResponseCache(path)) as cache:
        assert cache.export(out, backend="other-mock") == len(scores)
    assert {json.loads(line)["kind"] for line in out.getvalue().splitlines()} == {"LoglikelihoodResult"}


def test_prune_deletes_what_is_older_or_of_a_backend_and_keeps_batch_records(tmp_path: Path) -> None:
    path, _, _ = filled(tmp_path)
    with sqlite3.connect(path) as db:  # ten entries written ten days ago
        db.execute(
            "UPDATE results SET created = julianday('now') - 10 "
            "WHERE key IN (SELECT key FROM results WHERE backend = 'mock' ORDER BY key LIMIT 10)"
        )
        db.execute(
            "INSERT INTO batches (file_id, fingerprint, endpoint, custom_ids, created) "
            "VALUES ('file-1', 'f', '/v1/chat/completions', '[]', julianday('now') - 30)"
        )
    with closing(ab.ResponseCache(path)) as cache:
        assert cache.prune(older_than_days=11) == 0
        assert cache.prune(older_than_days=9.5) == 10
        assert len(cache) == 60
        assert cache.prune(backend="other-mock") == 20
        assert cache.stats()["by_backend"] == [{"backend": "mock", "kind": "GenerationResult", "entries": 40}]
        assert cache.stats()["batches_in_flight"] == 1  # a paid batch is never forgotten by a prune
        assert cache.prune(older_than_days=0, backend="nobody") == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [({}, "needs older_than_days or backend"), ({"older_than_days": -1}, ">= 0"),
     ({"older_than_days": float("nan")}, ">= 0"), ({"older_than_days": "7"}, "a number")],
)  # fmt: skip
def test_prune_refuses_what_would_delete_everything_or_is_no_age(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    with (
        closing(ab.ResponseCache(tmp_path / "c.sqlite")) as cache,
        pytest.raises(ab.InvalidRequestError, match=message),
    ):
        cache.prune(**options)  # type: ignore[arg-type]
