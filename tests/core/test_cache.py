from __future__ import annotations

import json
import sqlite3
import stat
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncbackends as ab
from asyncbackends._cache import CacheReadWarning
from asyncbackends._cache_codec import decode_request, encode_request


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


def test_a_broken_cache_file_does_not_fail_the_run_but_warns_once_and_counts(
    tmp_path: Path, make_mock: Any
) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    cache._db.execute("DROP TABLE results")  # reads and writes now fail inside SQLite
    metrics = ab.RunMetrics()
    batch = [ab.GenerationRequest(f"x{i}") for i in range(5)]
    with pytest.warns(CacheReadWarning, match="OperationalError: no such table") as caught:
        results = ab.run_batch(make_mock(), batch, cache=cache, metrics=metrics, concurrency=1)
    assert [r.text for r in results] == [f"x{i}" for i in range(5)]
    assert len([w for w in caught if w.category is CacheReadWarning]) == 1  # once, not once per request
    assert cache.read_failures == 5 and metrics.cache_read_failures == 5
    assert "cache read failures: 5" in metrics.format()
    cache.close()


class NoTokenIds(ab.BaseBackend):
    """An adapter that reports no token ids (``None``) and no logprobs: what some servers give."""

    name = "no-token-ids"

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.calls += 1
        completion = ab.Completion(str(request.prompt), token_ids=None, logprobs=None)  # type: ignore[arg-type]
        return ab.GenerationResult(request.request_id, (completion,), prompt_tokens=None, model=None)


def test_a_run_of_an_adapter_without_token_ids_resumes_from_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    batch = [ab.GenerationRequest(f"p{i}", request_id=f"r{i}") for i in range(4)]
    first = ab.run_batch(NoTokenIds(), batch, cache=path)
    again = NoTokenIds()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a read failure would warn: it must not happen at all
        second = ab.run_batch(again, batch, cache=path)
    assert again.calls == 0 and second == first


_floats = st.floats(allow_nan=False)  # NaN is never equal to itself; infinities are kept
_ints = st.integers(-(2**70), 2**70)
_maybe_text = st.none() | st.text()
_completions = st.builds(
    ab.Completion,
    text=st.text(),
    token_ids=st.none() | st.lists(_ints).map(tuple) | st.lists(_ints),
    logprobs=st.none() | st.lists(_floats).map(tuple) | st.lists(_floats),
    finish_reason=_maybe_text,
    token_texts=st.none() | st.lists(st.text()).map(tuple) | st.lists(st.text()),
)
_results = st.builds(
    ab.GenerationResult,
    request_id=_maybe_text,
    completions=st.lists(_completions, max_size=3).map(tuple),
    prompt_tokens=st.none() | _ints,
    model=_maybe_text,
    generated_tokens=st.none() | st.integers(0, 2**70),
) | st.builds(
    ab.LoglikelihoodResult,
    request_id=_maybe_text,
    logprob=_floats | _ints,
    is_greedy=st.none() | st.booleans(),
    num_tokens=_ints,
    token_logprobs=st.none() | st.lists(_floats).map(tuple) | st.lists(_floats),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(result=_results)
def test_every_result_the_types_accept_reads_back_equal(tmp_path: Path, result: ab.GenerationResult) -> None:
    request = ab.GenerationRequest("x", request_id=result.request_id)
    cache = ab.ResponseCache(tmp_path / "round-trip.sqlite")
    try:
        cache.put(ab.create_backend("mock"), request, result)
        assert cache.get(ab.create_backend("mock"), request) == result
    finally:
        cache.close()


def test_numpy_like_scalars_are_stored_as_plain_numbers(tmp_path: Path) -> None:
    class Int:
        def __init__(self, value: int) -> None:
            self.value = value

        def __index__(self) -> int:
            return self.value

    completion = ab.Completion("a", token_ids=[Int(3), Int(4)])  # type: ignore[list-item]
    assert completion.token_ids == (3, 4)
    result = ab.GenerationResult("r", (completion,))
    request = ab.GenerationRequest("x", request_id="r")
    cache = ab.ResponseCache(tmp_path / "n.sqlite")
    cache.put(ab.create_backend("mock"), request, result)
    assert cache.get(ab.create_backend("mock"), request) == result
    cache.close()


@pytest.mark.parametrize(
    "build",
    [
        lambda: ab.Completion(3),  # type: ignore[arg-type]
        lambda: ab.Completion("a", token_ids=[1.5]),  # type: ignore[list-item]
        lambda: ab.Completion("a", token_ids="abc"),  # type: ignore[arg-type]
        lambda: ab.Completion("a", logprobs=["x"]),  # type: ignore[list-item]
        lambda: ab.Completion("a", finish_reason=1),  # type: ignore[arg-type]
        lambda: ab.Completion("a", token_texts="ab"),  # type: ignore[arg-type]
        lambda: ab.Completion("a", token_texts=[1]),  # type: ignore[list-item]
        lambda: ab.GenerationResult("r", (), generated_tokens=-1),
        lambda: ab.GenerationResult("r", (), generated_tokens=2.0),  # type: ignore[arg-type]
        lambda: ab.GenerationResult("r", (), generated_tokens=True),
        lambda: ab.GenerationResult("r", ("text",)),  # type: ignore[arg-type]
        lambda: ab.GenerationResult("r", "text"),  # type: ignore[arg-type]
        lambda: ab.GenerationResult("r", (), prompt_tokens=1.0),  # type: ignore[arg-type]
        lambda: ab.GenerationResult(3, ()),  # type: ignore[arg-type]
        lambda: ab.LoglikelihoodResult("r", float("nan")),
        lambda: ab.LoglikelihoodResult("r", "1"),  # type: ignore[arg-type]
        lambda: ab.LoglikelihoodResult("r", -1.0, is_greedy=1),  # type: ignore[arg-type]
        lambda: ab.LoglikelihoodResult("r", -1.0, num_tokens=1.0),  # type: ignore[arg-type]
        lambda: ab.LoglikelihoodResult("r", -1.0, token_logprobs="ab"),  # type: ignore[arg-type]
    ],
)
def test_results_that_could_not_round_trip_are_refused_when_built(build: Any) -> None:
    with pytest.raises(ab.InvalidRequestError):
        build()


# Edges of the cache's storage format and reports (found by mutation testing).


class NumpyLikeInt:
    """Like numpy.int64: an index and a float, not an int."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value

    def __float__(self) -> float:
        return float(self.value)

    def __eq__(self, other: object) -> bool:
        return other == self.value

    def __hash__(self) -> int:
        return hash(self.value)


class NumpyLikeFloat:
    def __init__(self, value: float) -> None:
        self.value = value

    def __float__(self) -> float:
        return self.value

    def __eq__(self, other: object) -> bool:
        return other == self.value

    def __hash__(self) -> int:
        return hash(self.value)


def test_numpy_like_scalars_in_tuples_are_stored_as_json_numbers(tmp_path: Path) -> None:
    # A tuple is taken as given (the types do not copy it), so the cache converts each scalar when it writes.
    completion = ab.Completion(
        "a",
        token_ids=(NumpyLikeInt(3), NumpyLikeInt(4)),  # type: ignore[arg-type]
        logprobs=(NumpyLikeFloat(-0.5),),  # type: ignore[arg-type]
    )
    result = ab.GenerationResult("r", (completion,))
    request = ab.GenerationRequest("x", request_id="r")
    cache = ab.ResponseCache(tmp_path / "n.sqlite")
    backend = ab.create_backend("mock")
    try:
        cache.put(backend, request, result)
        (value,) = cache._db.execute("SELECT value FROM results").fetchone()
        assert '"token_ids":[3,4]' in value and '"logprobs":[-0.5]' in value
        back = cache.get(backend, request)
        assert back is not None and back.completions[0].token_ids == (3, 4)
        assert back.completions[0].logprobs == (-0.5,)

        odd = ab.Completion("a", token_ids=(object(),))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^object is not JSON serialisable$"):
            cache.put(backend, request, ab.GenerationResult("r", (odd,)))
    finally:
        cache.close()


def test_repr_and_stats_name_the_file(tmp_path: Path, make_mock: Any) -> None:
    path = tmp_path / "c.sqlite"
    cache = ab.ResponseCache(path)
    try:
        ab.run_batch(make_mock(), [ab.GenerationRequest("x")], cache=cache)
        assert repr(cache) == f"ResponseCache({str(path)!r})"
        stats = cache.stats()
        assert stats["path"] == str(path)
        assert stats["bytes"] == path.stat().st_size > 0
    finally:
        cache.close()


def test_an_entry_of_an_unknown_kind_is_a_miss_that_names_the_kind(tmp_path: Path, make_mock: Any) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    backend = make_mock()
    request = ab.GenerationRequest("x")
    try:
        cache._db.execute(
            "INSERT INTO results (key, kind, backend, value) VALUES (?, 'Bogus', 'mock', '{}')",
            (cache.key(backend, request),),
        )
        with pytest.warns(CacheReadWarning, match="ValueError: unknown result kind 'Bogus'"):
            assert ab.run_batch(backend, [request], cache=cache)[0].text == "x"
    finally:
        cache.close()


@pytest.mark.parametrize("neighbour", ["text", "not UTF-8"])
def test_damaged_entries_among_good_ones_are_sent_again_and_the_rest_read(
    tmp_path: Path, make_mock: Any, neighbour: str
) -> None:
    # A chunk is read as one text joined with ASCII RS and US (`_cache._LOOKUP`): values holding those raw,
    # or not text at all, must cost only their own entries, never their chunk's; and whether an entry is
    # read must not depend on its neighbours (a blob that is not UTF-8 sends the chunk row by row).
    path = tmp_path / "c.sqlite"
    requests = [ab.GenerationRequest(f"p{i}", request_id=f"r{i}") for i in range(30)]
    first = ab.run_batch(make_mock(), requests, cache=path)
    damaged = {
        3: "value || char(30) || 'tail'",  # a row separator inside a value
        7: "'x' || char(31) || char(30) || char(31)",  # both separators
    }
    if neighbour == "not UTF-8":
        damaged[11] = "X'80ff'"
    readable = {
        12: "CAST(value AS BLOB)",  # a blob holding a good result, as json.loads reads it
        13: "' ' || value || char(10)",  # whitespace around the JSON, as another tool may write it
    }
    backend = make_mock()
    cache = ab.ResponseCache(path)
    try:
        for index, expression in {**damaged, **readable}.items():
            key = cache.key(backend, requests[index])
            cache._db.execute(f"UPDATE results SET value = {expression} WHERE key = ?", (key,))
        metrics = ab.RunMetrics()
        with pytest.warns(CacheReadWarning):
            results = ab.run_batch(backend, requests, cache=cache, metrics=metrics)
    finally:
        cache.close()
    assert [r.text for r in results] == [r.text for r in first] == [f"p{i}" for i in range(30)]
    assert {key for key, count in backend.attempts.items() if count} == {f"r{i}" for i in damaged}
    assert sum(backend.attempts.values()) == len(damaged)
    assert metrics.cache_hits == 30 - len(damaged) and metrics.cache_read_failures == len(damaged)


def test_a_chunk_longer_than_sqlites_string_limit_is_read_row_by_row(tmp_path: Path, make_mock: Any) -> None:
    # Long generations make long rows: 20 of ~120 KB joined pass a 1 MB length limit (SQLite's default is
    # 1e9, reached by 500 rows of 2 MB), which must cost nothing but the joined read.
    path = tmp_path / "c.sqlite"
    params = ab.SamplingParams(max_tokens=30_000)  # the mock echoes the prompt up to max_tokens
    requests = [ab.GenerationRequest(f"{i} " + "x" * 20_000, params, request_id=f"r{i}") for i in range(20)]
    first = ab.run_batch(make_mock(), requests, cache=path)
    cache = ab.ResponseCache(path)
    try:
        assert cache._db.execute("SELECT sum(length(value)) FROM results").fetchone()[0] > 2_000_000
        cache._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_000_000)
        backend = make_mock()
        metrics = ab.RunMetrics()
        results = ab.run_batch(backend, requests, cache=cache, metrics=metrics)
    finally:
        cache.close()
    assert [r.text for r in results] == [r.text for r in first]
    assert metrics.cache_hits == 20 and sum(backend.attempts.values()) == 0


def test_the_reader_thread_ends_with_the_cache_and_a_lookup_after_close_starts_none(
    tmp_path: Path, make_mock: Any
) -> None:
    path = tmp_path / "c.sqlite"
    requests = [ab.GenerationRequest(f"p{i}") for i in range(3)]
    ab.run_batch(make_mock(), requests, cache=path)
    cache = ab.ResponseCache(path)
    keys = [cache.key(make_mock(), r) for r in requests]

    def readers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("asyncbackends-cache-reader")]

    before = set(readers())
    assert set(cache.lookup(keys).result()) == set(keys)  # read on the reader thread
    assert len(set(readers()) - before) == 1
    cache.close()
    assert not set(readers()) - before
    late = cache.lookup(keys)
    with pytest.raises(sqlite3.ProgrammingError):  # closed: each key a failed read for the run, as before
        late.result()
    assert not set(readers()) - before


class Fingerprinted(ab.BaseBackend):
    name = "fingerprinted"

    def __init__(self, fingerprint: dict[str, str]) -> None:
        self.fingerprint = fingerprint

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        return ab.GenerationResult(request.request_id, (ab.Completion("x"),))


def test_equal_fingerprints_in_any_order_share_a_key(tmp_path: Path) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    request = ab.GenerationRequest("x")
    one = Fingerprinted({"name": "m", "model": "tiny"})
    other = Fingerprinted({"model": "tiny", "name": "m"})
    try:
        assert cache.key(one, request) == cache.key(other, request)
        assert cache.key(one, request) != cache.key(Fingerprinted({"name": "m", "model": "big"}), request)
    finally:
        cache.close()


def test_a_batch_records_requests_read_back_equal() -> None:
    """A provider batch's record keeps its requests (JSON in the file) so any later run can read them."""
    tool = ab.Tool("add", "adds", {"type": "object", "properties": {"x": {"type": "integer"}}})
    requests = [
        ab.GenerationRequest(
            "text", ab.SamplingParams(max_tokens=3, stop=("a", "b"), seed=4), request_id="t"
        ),
        ab.GenerationRequest(
            [{"role": "user", "content": "hi"}],
            ab.SamplingParams(logprobs=True, json_schema={"type": "object"}, reasoning_effort="low"),
            tools=(tool,),
            tool_choice="add",
        ),
        ab.GenerationRequest([1, 2, 3], ab.SamplingParams(n=2, temperature=1.0, min_p=0.1)),
    ]
    for request in requests:
        assert decode_request(json.loads(json.dumps(encode_request(request)))) == request


PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5E"
    "rkJggg=="
)


def test_keys_are_those_earlier_files_hold() -> None:
    """Digests written by the version that serialised keys with dataclasses.asdict: a resume still finds them."""
    tool = ab.Tool("add", "adds", {"type": "object", "properties": {"x": {"type": "integer"}}})
    image = [{"type": "text", "text": "what"}, {"type": "image_url", "image_url": {"url": PNG}}]
    schema = {"type": "object", "b": [1, 2]}
    requests: list[Any] = [
        ab.GenerationRequest("text", request_id="ignored"),
        ab.GenerationRequest(
            "text", ab.SamplingParams(max_tokens=3, stop=("a", "b"), seed=4, json_schema=schema)
        ),
        ab.GenerationRequest(
            [{"role": "user", "content": "hi"}],
            ab.SamplingParams(logprobs=True),
            tools=(tool,),
            tool_choice="add",
        ),
        ab.GenerationRequest([{"role": "user", "content": image}]),
        ab.GenerationRequest(
            [1, 2, 3], ab.SamplingParams(n=2, temperature=1.0, min_p=0.1, reasoning_effort="low")
        ),
        ab.LoglikelihoodRequest("ctx", " cont"),
        ab.RollingLoglikelihoodRequest("rolling text"),
    ]
    backend = ab.create_backend("mock")
    assert [ab.ResponseCache.key(None, backend, r) for r in requests] == [  # type: ignore[arg-type]
        "d47d040166b050e32a5e6d887e3223446ef35a78a79ea03ed9f86c93bd035d83",
        "479c7c2ec121d0d6b1d29d11df3456cfa6ef74db87d9279ea4736d0bd67d44f3",
        "f6277e83664caff295e09f975fd26eec174bb412518f81f6664bc6137e0a7298",
        "88653a52fee07577bdc83ccaf7cf8c8ab5b78af8db24af35fd71b488c53f00a3",
        "44db5077cd3182640fa6e2c5cdaae0e583f512650f25629bc28619bdec9f7c2f",
        "2802a40c7618638fb78fddea88a315d52ad2e66330ba7643ff9f937ce0654527",
        "969659c0a3e5d259a1613ab913d732c8a52c86d61d134335178474414ce110b0",
    ]
    assert image[1]["image_url"]["url"] == PNG  # the request's own message is left as it was
