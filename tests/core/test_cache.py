from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab


def test_a_killed_run_resumes_sending_only_what_is_missing(tmp_path: Path, make_mock: Any) -> None:
    path = tmp_path / "run.sqlite"
    first = make_mock(failure_rate=0.4, failure="rejected", seed=7)
    batch = [ab.GenerationRequest(f"p{i}", request_id=f"r{i}") for i in range(40)]
    partial = ab.run_batch(first, batch, cache=path, return_exceptions=True)
    done = [o for o in partial if isinstance(o, ab.GenerationResult)]
    assert 0 < len(done) < 40

    second = make_mock()
    metrics = ab.RunMetrics()
    results = ab.run_batch(second, batch, cache=path, metrics=metrics)
    assert [r.text for r in results] == [f"p{i}" for i in range(40)]
    assert [r.request_id for r in results] == [f"r{i}" for i in range(40)]
    assert metrics.cache_hits == len(done)
    assert sum(second.attempts.values()) == 40 - len(done)  # errors were never cached


def test_cache_key_ignores_request_id_and_respects_params_and_fingerprint(
    tmp_path: Path, make_mock: Any
) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    backend = make_mock()
    other_model = make_mock(model="other")
    a = ab.GenerationRequest("x", request_id="a")
    b = ab.GenerationRequest("x", request_id="b")
    c = ab.GenerationRequest("x", ab.SamplingParams(max_tokens=5))
    assert cache.key(backend, a) == cache.key(backend, b)
    assert cache.key(backend, a) != cache.key(backend, c)
    assert cache.key(backend, a) != cache.key(other_model, a)
    ab.run_batch(backend, [a], cache=cache)
    hit = cache.get(backend, b)
    assert hit is not None and hit.request_id == "b" and hit.text == "x"  # type: ignore[union-attr]
    cache.close()


def test_unseeded_sampling_is_cached_only_when_asked(tmp_path: Path, make_mock: Any) -> None:
    backend = make_mock()
    unseeded = ab.GenerationRequest("abc", ab.SamplingParams(temperature=1.0))
    seeded = ab.GenerationRequest("abc", ab.SamplingParams(temperature=1.0, seed=3, n=2, logprobs=True))
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    ab.run_batch(backend, [unseeded, seeded], cache=cache)
    assert len(cache) == 1 and cache.get(backend, unseeded) is None
    stored = cache.get(backend, seeded)
    assert stored == ab.run_batch(backend, [seeded])[0]  # a faithful round trip, tuples included
    opted = ab.ResponseCache(tmp_path / "d.sqlite", cache_unseeded=True)
    ab.run_batch(backend, [unseeded], cache=opted)
    assert len(opted) == 1
    cache.close()
    opted.close()


def test_loglikelihood_results_round_trip(tmp_path: Path, make_mock: Any) -> None:
    backend = make_mock()
    request = ab.LoglikelihoodRequest("ctx", "cont", request_id="s")
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    (fresh,) = ab.run_batch(backend, [request], cache=cache)
    assert cache.get(backend, request) == fresh
    cache.close()


def test_file_is_private_and_holds_no_secret(tmp_path: Path) -> None:
    class Secretive(ab.BaseBackend):
        name = "secretive"

        def __init__(self) -> None:
            self.capabilities = ab.Capabilities()
            self.token = ab.Secret("hf_topsecret_value")

        @property
        def fingerprint(self) -> dict[str, str]:
            return {"name": self.name, "model": "m"}

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            return ab.GenerationResult(request.request_id, (ab.Completion("ok"),))

    path = tmp_path / "c.sqlite"
    ab.run_batch(Secretive(), [ab.GenerationRequest("x")], cache=path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"hf_topsecret_value" not in raw


def test_stats_and_clear(tmp_path: Path, make_mock: Any) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    ab.run_batch(make_mock(), [ab.GenerationRequest(f"{i}") for i in range(5)], cache=cache)
    stats = cache.stats()
    assert stats["entries"] == 5 and stats["by_backend"] == [
        {"backend": "mock", "kind": "GenerationResult", "entries": 5}
    ]
    assert cache.clear() == 5 and len(cache) == 0
    cache.close()


def test_integer_and_float_temperature_are_one_key(tmp_path: Path, make_mock: Any) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    backend = make_mock()
    as_int = ab.GenerationRequest("x", ab.SamplingParams(temperature=0))
    as_float = ab.GenerationRequest("x", ab.SamplingParams(temperature=0.0))
    assert as_int == as_float
    assert cache.key(backend, as_int) == cache.key(backend, as_float)
    cache.close()


def test_refused_options_open_no_cache(tmp_path: Path, make_mock: Any) -> None:
    path = tmp_path / "never.sqlite"
    with pytest.raises(ab.InvalidRequestError):
        ab.run_batch(make_mock(), [ab.GenerationRequest("x")], cache=path, concurrency=0)
    assert not path.exists()


def test_a_broken_cache_file_does_not_fail_the_run(tmp_path: Path, make_mock: Any) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    cache._db.execute("DROP TABLE results")  # reads and writes now fail inside SQLite
    results = ab.run_batch(make_mock(), [ab.GenerationRequest("x")], cache=cache)
    assert results[0].text == "x"
    cache.close()
