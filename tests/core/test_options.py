"""`RunOptions`: one typed, validated value per run; misspelled or bad options refused before anything opens."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import random
import sqlite3
import types
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
import asyncbackends._limits as limits_module
import asyncbackends._options as options_module
import asyncbackends._run as run_module
from asyncbackends._limits import TokenBucket, estimated_tokens
from asyncbackends._options import OPTION_NAMES, RunOptions, RunOptionsKwargs, refuse_unknown_options
from asyncbackends.adapters.mock import MockBackend


def requests(n: int) -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"p{i}", request_id=f"p{i}") for i in range(n)]


def test_the_entry_points_take_exactly_the_run_options() -> None:
    import inspect
    import typing

    # The TypedDict the entry points unpack holds RunOptions' fields, typed alike, but return_exceptions,
    # which each entry point names itself: a field added to RunOptions and not to it fails here.
    # RunOptions reports the package as its module: its annotations are read in the module that writes them.
    fields = typing.get_type_hints(RunOptions, vars(options_module))
    unpacked = typing.get_type_hints(RunOptionsKwargs)
    assert set(unpacked) | {"return_exceptions"} == set(OPTION_NAMES)
    assert unpacked == {name: fields[name] for name in unpacked}
    for entry in (ab.gather, ab.run_batch, ab.as_completed):
        parameters = inspect.signature(entry).parameters.values()
        keywords = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]
        assert keywords == ["return_exceptions"], entry.__name__
        (options,) = [p for p in parameters if p.kind is p.VAR_KEYWORD]
        assert typing.get_type_hints(entry)[options.name] == typing.Unpack[RunOptionsKwargs], entry.__name__


@pytest.mark.parametrize(
    ("typo", "suggested"),
    [
        ("concurency", "concurrency"),
        ("retries", "retry"),
        ("time_out", "timeout"),
        ("ratelimit", "rate_limit"),
    ],
)
def test_a_misspelled_option_names_the_closest_valid_one(
    mock: MockBackend, typo: str, suggested: str
) -> None:
    options: dict[str, Any] = {typo: 4}
    with pytest.raises(ab.InvalidRequestError, match=f"unknown run option '{typo}'.*'{suggested}'"):
        ab.run_batch(mock, requests(2), **options)
    with pytest.raises(ab.InvalidRequestError, match=suggested):
        asyncio.run(ab.gather(mock, requests(2), **options))

    async def drain() -> None:
        async for _ in ab.as_completed(mock, requests(2), **options):
            pass

    with pytest.raises(ab.InvalidRequestError, match=suggested):
        asyncio.run(drain())
    assert mock.attempts == {}  # refused before anything was sent


def test_an_option_far_from_every_name_lists_them_all() -> None:
    with pytest.raises(ab.InvalidRequestError, match="valid options: concurrency, retry"):
        refuse_unknown_options({"zzzz": 1})
    refuse_unknown_options({})


@pytest.mark.parametrize(
    "options",
    [
        {"concurrency": 0},
        {"concurrency": True},
        {"concurrency": 2.0},
        {"timeout": 0},
        {"timeout": -1},
        {"timeout": math.inf},
        {"timeout": math.nan},
        {"timeout": True},
        {"timeout": "1"},
        {"retry": 3},
        {"rate_limit": 10},
        {"cache": 3},
        {"progress": 1},
        {"return_exceptions": "yes"},
        {"metrics": {}},
    ],
)
def test_bad_values_are_refused_when_the_options_are_built(options: dict[str, Any]) -> None:
    with pytest.raises(ab.InvalidRequestError, match=next(iter(options))):
        RunOptions(**options)


@pytest.mark.parametrize(
    "policy",
    [
        {"max_attempts": 0},
        {"max_attempts": True},
        {"max_attempts": 1.5},
        {"initial_delay": -1},
        {"max_delay": math.inf},
        {"max_delay": math.nan},
        {"initial_delay": "1"},
        {"jitter": 1},
    ],
)
def test_bad_retry_policies_are_refused(policy: dict[str, Any]) -> None:
    with pytest.raises(ab.InvalidRequestError, match=next(iter(policy))):
        ab.RetryPolicy(**policy)


@pytest.mark.parametrize("rate", [0, -1, math.inf, math.nan, True, "5"])
def test_bad_rates_are_refused(rate: Any) -> None:
    with pytest.raises(ab.InvalidRequestError, match="requests_per_second"):
        ab.RateLimit(requests_per_second=rate)
    with pytest.raises(ab.InvalidRequestError, match="tokens_per_minute"):
        ab.RateLimit(tokens_per_minute=rate)


def test_run_options_are_frozen_and_exported() -> None:
    options = ab.RunOptions(concurrency=3, timeout=1)
    with pytest.raises(AttributeError):
        options.concurrency = 4  # type: ignore[misc]
    # The module, not the function's __globals__: a wrapped gather (a mutation tester's) has others.
    assert ab.RetryPolicy is importlib.import_module("asyncbackends._gather").RetryPolicy
    assert ab.DEFAULT_CONCURRENCY == 64


@pytest.mark.parametrize("bad", [{"concurrency": 0}, {"concurency": 2}])
def test_a_refused_run_opens_no_cache(mock: MockBackend, tmp_path: Path, bad: dict[str, Any]) -> None:
    path = tmp_path / "cache.sqlite"
    with pytest.raises(ab.InvalidRequestError):
        ab.run_batch(mock, requests(2), cache=path, **bad)
    assert not path.exists()

    async def drain() -> None:
        async for _ in ab.as_completed(mock, requests(2), cache=path, **bad):
            pass

    with pytest.raises(ab.InvalidRequestError):
        asyncio.run(drain())
    assert not path.exists()


def test_a_cache_opened_for_a_run_is_closed_however_the_run_ends(
    make_mock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[ab.ResponseCache] = []
    real_open = run_module.open_cache

    def recording_open(cache: Any) -> ab.ResponseCache:
        if isinstance(cache, ab.ResponseCache):
            return cache
        opened.append(real_open(cache))
        return opened[-1]

    monkeypatch.setattr(run_module, "open_cache", recording_open)
    failing = make_mock(failure_rate=1.0, failure="rejected")
    with pytest.raises(ab.RequestRejectedError):
        ab.run_batch(failing, requests(3), cache=tmp_path / "a.sqlite")
    ab.run_batch(make_mock(), requests(3), cache=tmp_path / "b.sqlite")
    assert len(opened) == 2
    for cache in opened:
        with pytest.raises(sqlite3.ProgrammingError):
            len(cache)  # closed

    # A cache object the caller passed stays the caller's: open after the run.
    mine = ab.ResponseCache(tmp_path / "c.sqlite")
    with contextlib.closing(mine):
        ab.run_batch(make_mock(), requests(3), cache=mine)
        assert len(mine) == 3  # still open: readable after the run


def test_the_edge_values_are_accepted() -> None:
    # The smallest valid value of each option (found by mutation testing: a bound moved by one passed).
    assert (
        ab.RetryPolicy(max_attempts=1, initial_delay=0, max_delay=0, jitter=False).delay(
            1, ab.BackendError("x")
        )
        == 0
    )
    assert ab.RateLimit(requests_per_second=1e-9, tokens_per_minute=1e-9).requests_per_second == 1e-9
    options = RunOptions(
        concurrency=1, timeout=1e-9, progress="label", cache="c.sqlite", return_exceptions=True
    )
    assert (options.concurrency, options.timeout, options.progress) == (1, ab.Timeouts(1e-9, None), "label")


def test_a_refused_value_is_named_in_the_message() -> None:
    cases: list[tuple[Any, str]] = [
        (
            lambda: RunOptions(concurrency=0),
            "concurrency must be an int >= 1, 'adaptive', an AdaptiveConcurrency or None, got 0",
        ),
        (
            lambda: RunOptions(timeout=-1),
            "timeout must be an ab.Timeouts, a finite number of seconds > 0 or None, got -1",
        ),
        (lambda: RunOptions(retry=3), "retry must be a RetryPolicy or None, got int"),  # type: ignore[arg-type]
        (
            lambda: RunOptions(cache=3),  # type: ignore[arg-type]
            "cache must be a ResponseCache or str or PathLike or None, got int",
        ),
        (lambda: RunOptions(progress=1), "progress must be a bool or a str, got int"),  # type: ignore[arg-type]
        (
            lambda: RunOptions(return_exceptions="yes"),  # type: ignore[arg-type]
            "return_exceptions must be a bool, got 'yes'",
        ),
        (lambda: ab.RetryPolicy(max_attempts=0), "max_attempts must be an int >= 1, got 0"),
        (lambda: ab.RetryPolicy(max_delay=-1), "max_delay must be a finite number >= 0, got -1"),
        (lambda: ab.RetryPolicy(jitter=1), "jitter must be a bool, got 1"),  # type: ignore[arg-type]
        (
            lambda: ab.RateLimit(tokens_per_minute=0),
            "tokens_per_minute must be a finite number > 0 or None, got 0",
        ),
    ]
    for build, message in cases:
        with pytest.raises(ab.InvalidRequestError) as info:
            build()
        assert str(info.value) == message


def test_jitter_draws_from_the_generator_given() -> None:
    policy = ab.RetryPolicy(initial_delay=1, max_delay=100)
    error = ab.BackendError("x")
    draws = [policy.delay(5, error, random.Random(7)) for _ in range(2)]
    assert draws[0] == draws[1] == random.Random(7).uniform(0, 16)


def test_a_valid_name_inside_the_unknown_one_is_suggested() -> None:
    # Edit distance alone finds nothing close to these.
    for unknown, suggested in (("response_cache", "cache"), ("per_request_timeout", "timeout")):
        with pytest.raises(ab.InvalidRequestError, match=f"did you mean '{suggested}'"):
            refuse_unknown_options({unknown: 1})


def test_the_token_estimate_a_rate_limit_charges() -> None:
    # RateLimit's documented estimate: token ids count one each, text four characters a token, plus
    # max_tokens * n; a scoring request is its text's size plus one.
    params = ab.SamplingParams(max_tokens=10, n=3, temperature=1.0)
    chat = [{"role": "user", "content": "abcd"}, {"role": "assistant", "content": "efghijkl"}]
    assert estimated_tokens(ab.GenerationRequest("abcdefgh", params)) == 2 + 30
    assert estimated_tokens(ab.GenerationRequest([1, 2, 3], params)) == 3 + 30
    assert estimated_tokens(ab.GenerationRequest(chat, params)) == 3 + 30
    assert estimated_tokens(ab.LoglikelihoodRequest("abcdef", "gh")) == 3
    assert estimated_tokens(ab.RollingLoglikelihoodRequest("abcdefgh")) == 3


def test_a_rate_limit_bucket_sleeps_just_until_it_holds_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [128.0]  # binary fractions throughout, so the arithmetic is exact
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    async def main() -> None:
        bucket = TokenBucket(rate_per_s=8, capacity=1)
        monkeypatch.setattr(limits_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
        monkeypatch.setattr(limits_module, "asyncio", types.SimpleNamespace(sleep=sleep))
        bucket.stamp = now[0]
        await bucket.take(1)  # the bucket starts full
        now[0] += 0.0625  # half a token back
        await bucket.take(1)

    asyncio.run(main())
    assert slept == [0.0625]  # the other half, no more
