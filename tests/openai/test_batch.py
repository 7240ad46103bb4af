"""``batch=True`` on the ``openai`` adapter against the Batch API look-alike (`FakeOpenAIBatchServer`).

Each batch result is compared with the plain path's answer to the same request on the same look-alike;
the server's counters prove what was sent (and that nothing was sent twice).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import asyncbackends as ab
from asyncbackends._cli.main import main as cli_main
from asyncbackends.abc import BatchRecord
from asyncbackends.adapters.openai import OpenAIBackend
from asyncbackends.testing.fake_openai_batches import FakeOpenAIBatchServer

from . import batch_client

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.asyncio


def same(a: Any, b: Any) -> bool:
    """Results equal; errors of one type, message and retryability."""
    if isinstance(a, ab.AsyncBackendsError) or isinstance(b, ab.AsyncBackendsError):
        return (
            type(a) is type(b)
            and str(a) == str(b)
            and getattr(a, "retryable", None) == getattr(b, "retryable", None)
            and getattr(a, "request_id", None) == getattr(b, "request_id", None)
        )
    return bool(a == b)


def assert_same(batch: Sequence[Any], plain: Sequence[Any]) -> None:
    assert len(batch) == len(plain)
    different = [(i, a, b) for i, (a, b) in enumerate(zip(batch, plain, strict=True)) if not same(a, b)]
    assert not different, different[:3]


def recorded(path: Path, backend: OpenAIBackend) -> list[Any]:
    """The batches the cache file still records for ``backend``."""
    cache = ab.ResponseCache(path)
    try:
        return list(cache.batch_records(backend))
    finally:
        cache.close()


async def backend_on(server: FakeOpenAIBatchServer, **options: Any) -> OpenAIBackend:
    options.setdefault("batch_poll_interval", 0.01)
    built = await ab.acreate_backend("openai", base_url=server.url, **options)
    assert isinstance(built, OpenAIBackend)
    return built


@pytest_asyncio.fixture
async def server() -> AsyncIterator[FakeOpenAIBatchServer]:
    async with FakeOpenAIBatchServer() as started:
        yield started


def mixed_requests() -> list[ab.GenerationRequest]:
    chat = [{"role": "user", "content": "what is 2 + 2?"}]
    return [
        ab.GenerationRequest("hello", ab.SamplingParams(max_tokens=5), request_id="text"),
        ab.GenerationRequest(chat, ab.SamplingParams(max_tokens=4, logprobs=True), request_id="chat"),
        ab.GenerationRequest("lp", ab.SamplingParams(max_tokens=3, logprobs=True)),
        ab.GenerationRequest("n", ab.SamplingParams(max_tokens=3, n=2, temperature=1.0, seed=7)),
        ab.GenerationRequest("stops", ab.SamplingParams(max_tokens=12, stop=("lima", "golf"))),
        ab.GenerationRequest("nothing", ab.SamplingParams(max_tokens=0), request_id="zero"),
        ab.GenerationRequest("refused [reject]", ab.SamplingParams(max_tokens=3), request_id="reject"),
        ab.GenerationRequest("broken [fail]", ab.SamplingParams(max_tokens=3), request_id="fail"),
        ab.GenerationRequest([1, 2, 3], ab.SamplingParams(max_tokens=3), request_id="ids"),
        ab.GenerationRequest("penalty", ab.SamplingParams(max_tokens=3, min_p=0.1), request_id="min_p"),
        ab.GenerationRequest("hello", ab.SamplingParams(max_tokens=5), request_id="again"),
    ]


async def test_batch_results_equal_the_plain_path(server: FakeOpenAIBatchServer) -> None:
    backend = await backend_on(server)
    try:
        requests = mixed_requests()
        metrics = ab.RunMetrics()
        done: list[ab.RequestDone] = []
        callbacks = ab.RunCallbacks(on_request_done=done.append)
        batch = await ab.gather(
            backend, requests, batch=True, return_exceptions=True, metrics=metrics, callbacks=callbacks
        )
        sent_in_batches = sum(server.batch_answered.values())
        plain = await ab.gather(
            backend, requests, return_exceptions=True, retry=ab.RetryPolicy(max_attempts=1)
        )
    finally:
        await backend.aclose()
    assert_same(batch, plain)
    assert isinstance(batch[0], ab.GenerationResult) and batch[0].request_id == "text"
    assert isinstance(batch[6], ab.RequestRejectedError) and "[reject]" in str(batch[6])
    assert type(batch[7]) is ab.BackendError and batch[7].retryable and "HTTP 500" in str(batch[7])
    assert isinstance(batch[9], ab.RequestRejectedError) and "min_p" in str(batch[9])  # refused unsent
    # One chat batch and one completions batch; max_tokens=0 and the refused request never sent.
    assert server.created == 2 and server.uploads == 2
    assert (
        sent_in_batches == 9 and len(server.batch_answered) == 8
    )  # "hello" twice: two lines, one answer each
    assert sum(server.plain_answered.values()) == 9  # [fail] answered once: no retries asked
    assert metrics.successes == 8 and metrics.errors == {"RequestRejectedError": 2, "BackendError": 1}
    assert sorted(d.index for d in done) == list(range(len(requests)))
    assert all(d.outcome is batch[d.index] for d in done)


async def test_split_at_the_request_and_byte_limits(server: FakeOpenAIBatchServer) -> None:
    requests = [ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=2)) for i in range(10)]
    backend = await backend_on(server, batch_max_requests=4)
    try:
        results = await ab.gather(backend, requests, batch=True)
    finally:
        await backend.aclose()
    assert server.created == 3 and [b["request_counts"]["total"] for b in server.batches.values()] == [
        4,
        4,
        2,
    ]
    sizes = [len(server.contents[b["input_file_id"]]) for b in server.batches.values()]
    limit = max(sizes) - 1  # one line less fits in each file now
    big = ab.GenerationRequest("x" * 1000, ab.SamplingParams(max_tokens=2), request_id="big")
    backend = await backend_on(server, batch_max_bytes=limit)
    try:
        again = await ab.gather(backend, [*requests, big], batch=True, return_exceptions=True)
    finally:
        await backend.aclose()
    assert again[:10] == results
    new = list(server.batches.values())[3:]
    assert all(len(server.contents[b["input_file_id"]]) <= limit for b in new) and len(new) > 3
    assert isinstance(again[10], ab.BackendError) and "over the batch limit" in str(again[10])
    assert not again[10].retryable and again[10].request_id == "big"
    assert not any("x" * 1000 in key for key in server.answered)  # never sent


async def test_a_failed_batch_fails_its_requests_only() -> None:
    async with FakeOpenAIBatchServer(fail_batches={1}) as server:
        backend = await backend_on(server, batch_max_requests=3)
        requests = [ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=2)) for i in range(5)]
        try:
            results = await ab.gather(backend, requests, batch=True, return_exceptions=True)
            plain = await ab.gather(backend, requests[3:])
        finally:
            await backend.aclose()
    assert all(isinstance(r, ab.RequestRejectedError) for r in results[:3])
    assert "failed: line 1: this batch was set to fail" in str(results[0])
    assert results[3:] == plain
    assert sum(server.batch_answered.values()) == 2


async def test_an_expired_batch_returns_what_it_answered_and_a_rerun_sends_the_rest(tmp_path: Path) -> None:
    cache = tmp_path / "run.sqlite"
    requests = [ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=2)) for i in range(10)]
    async with FakeOpenAIBatchServer(expire_batches={1}) as server:
        backend = await backend_on(server)
        try:
            first = await ab.gather(backend, requests, batch=True, cache=cache, return_exceptions=True)
            second = await ab.gather(backend, requests, batch=True, cache=cache, return_exceptions=True)
            plain = await ab.gather(backend, requests)
        finally:
            await backend.aclose()
    assert first[:5] == plain[:5]
    expired = first[5:]
    assert all(type(e) is ab.BackendTimeoutError and e.retryable for e in expired)
    assert "batch_expired" in str(expired[0])
    assert second == plain  # the five answered came from the cache; the five expired were sent again
    assert server.created == 2 and sorted(b["request_counts"]["total"] for b in server.batches.values()) == [
        5,
        10,
    ]
    assert all(count == 1 for count in server.batch_answered.values()) and len(server.batch_answered) == 10


async def test_partial_errors_map_like_the_plain_path(server: FakeOpenAIBatchServer) -> None:
    requests = [
        ab.GenerationRequest("fine" if i % 3 else f"bad {i} [reject]", ab.SamplingParams(max_tokens=2))
        for i in range(9)
    ]
    backend = await backend_on(server)
    try:
        batch = await ab.gather(backend, requests, batch=True, return_exceptions=True)
        plain = await ab.gather(backend, requests, return_exceptions=True)
        with pytest.raises(ab.RequestRejectedError, match=r"\[reject\]"):
            await ab.gather(backend, requests, batch=True)  # without return_exceptions: the first error
    finally:
        await backend.aclose()
    assert_same(batch, plain)
    assert [isinstance(r, ab.RequestRejectedError) for r in batch] == [i % 3 == 0 for i in range(9)]
    (first,) = [b for b in server.batches.values()][:1]
    assert first["request_counts"] == {"total": 9, "completed": 6, "failed": 3}


async def test_refused_before_anything_is_sent(server: FakeOpenAIBatchServer) -> None:
    backend = await backend_on(server)
    mock = ab.create_backend("mock")
    request = ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=2))
    try:
        with pytest.raises(ab.InvalidRequestError, match="has no batch API"):
            await ab.gather(mock, [request], batch=True)
        with pytest.raises(ab.InvalidRequestError, match="generation requests only"):
            await ab.gather(backend, [request, ab.LoglikelihoodRequest("a", " b")], batch=True)
        refused = (
            {"concurrency": 4},
            {"timeout": 10.0},
            {"timeout": ab.Timeouts(total=10)},
            {"rate_limit": ab.RateLimit(1)},
        )
        for option in refused:
            with pytest.raises(ab.InvalidRequestError, match="no meaning with batch=True"):
                await ab.gather(backend, [request], batch=True, **option)
        with pytest.raises(ab.InvalidRequestError, match="batch must be a bool"):
            await ab.gather(backend, [request], batch="yes")  # type: ignore[call-overload]
        with pytest.raises(ab.InvalidRequestError, match="batch max_requests"):
            await ab.acreate_backend("openai", base_url=server.url, batch_max_requests=0)
    finally:
        await backend.aclose()
        await mock.aclose()
    assert server.uploads == 0 and server.created == 0 and not server.answered


async def test_progress_shows_the_batches_while_polling(capsys: pytest.CaptureFixture[str]) -> None:
    requests = [ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=2)) for i in range(4)]
    async with FakeOpenAIBatchServer(hold=True) as server:  # in progress until released
        backend = await backend_on(server, batch_poll_interval=0.02)
        try:
            run = asyncio.ensure_future(ab.gather(backend, requests, batch=True, progress="eval"))
            await server.wait_until(lambda s: sum(s.polls.values()) >= 3)
            server.release()
            results = await run
        finally:
            await backend.aclose()
    assert len(results) == 4
    err = capsys.readouterr().err
    assert "eval" in err and "batches: 1 in_progress; in flight answered 0/4" in err


async def test_a_cancelled_run_on_a_cache_resumes_its_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cancelled (and, separately, a record left without its batch id): the next run sends nothing again."""
    cache = tmp_path / "run.sqlite"
    requests = [ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=3)) for i in range(6)]
    # Unseeded sampling is never stored as a result, yet its batch line is resumed like the others.
    requests.append(ab.GenerationRequest("sampled", ab.SamplingParams(max_tokens=3, temperature=1.0)))
    async with FakeOpenAIBatchServer(hold=True) as server:
        backend = await backend_on(server)
        try:
            run = asyncio.ensure_future(ab.gather(backend, requests, batch=True, cache=cache))
            await server.wait_until(lambda s: sum(s.polls.values()) >= 1)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            assert server.paths["/v1/batches/{id}/cancel"] == 0  # on a cache: kept for the next run
            assert await asyncio.to_thread(cli_main, ["cache", "stats", str(cache)]) == 0
            assert '"batches_in_flight": 1' in capsys.readouterr().out
            # As if killed between creating the batch and recording its id: found by its input file.
            with sqlite3.connect(cache) as db:
                db.execute("UPDATE batches SET batch_id = NULL")
            server.release()
            resumed = await ab.gather(backend, requests, batch=True, cache=cache)
            plain = await ab.gather(backend, requests)
        finally:
            await backend.aclose()
    assert resumed == plain
    assert server.uploads == 1 and server.created == 1 and server.paths["/v1/batches"] >= 2
    assert all(count == 1 for count in server.batch_answered.values())
    assert recorded(cache, backend) == []


async def test_clear_forgets_recorded_batches(tmp_path: Path) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    backend = ab.create_backend("mock")
    try:
        cache.add_batch(backend, BatchRecord("file-1", "/v1/completions", "batch_1", ("k-0",)))
        assert (
            cache.stats()["batches_in_flight"] == 1 and cache.batch_records(backend)[0].batch_id == "batch_1"
        )
        assert cache.clear() == 0 and cache.batch_records(backend) == []
    finally:
        cache.close()
        await backend.aclose()


async def test_a_cancelled_run_without_a_cache_cancels_its_batch() -> None:
    async with FakeOpenAIBatchServer(hold=True) as server:
        backend = await backend_on(server)
        requests = [ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=3)) for i in range(3)]
        try:
            run = asyncio.ensure_future(ab.gather(backend, requests, batch=True))
            await server.wait_until(lambda s: sum(s.polls.values()) >= 1)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
        finally:
            await backend.aclose()
        server.release()
        await server.wait_until(
            lambda s: next(iter(s.batches.values()))["status"] in ("completed", "cancelled")
        )
    assert next(iter(server.batches.values()))["status"] == "cancelled"
    assert server.paths["/v1/batches/{id}/cancel"] == 1 and not server.answered


async def test_cli_batch(server: FakeOpenAIBatchServer, tmp_path: Path) -> None:
    source = tmp_path / "requests.jsonl"
    source.write_text('{"prompt": "one", "params": {"max_tokens": 3}}\n{"prompt": "two"}\n')
    output = tmp_path / "out.jsonl"
    args = ["run", str(source), "--backend", "openai", "--batch", "--output", str(output), "--no-progress"]
    options = ["--option", f"base_url={server.url}", "--option", "batch_poll_interval=0.01"]
    assert await asyncio.to_thread(cli_main, [*args, *options]) == 0
    assert server.created == 1 and len(server.batch_answered) == 2 and not server.plain_answered
    assert output.read_text().count('"text"') == 2
    assert await asyncio.to_thread(cli_main, [*args, *options, "--concurrency", "4"]) == 2  # refused


@pytest.mark.slow
async def test_killed_client_resumes_its_two_batches_and_sends_nothing_twice(tmp_path: Path) -> None:
    """1,000 requests in two batches; the client SIGKILLed while both are in flight, then run again."""
    cache = tmp_path / "run.sqlite"
    requests = batch_client.requests()
    async with FakeOpenAIBatchServer(hold=True) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [sys.executable, "-m", "tests.openai.batch_client", server.url, str(cache)]
        proc = await asyncio.create_subprocess_exec(
            *args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            # Both batches created and polled: their ids are in the cache (written before the first poll).
            await asyncio.wait_for(
                server.wait_until(lambda s: s.created == 2 and len(s.polls) == 2), timeout=100
            )
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert not server.answered and server.uploads == 2
        server.release()
        backend = await backend_on(server, batch_max_requests=batch_client.SPLIT)
        try:
            metrics = ab.RunMetrics()
            resumed = await ab.gather(backend, requests, batch=True, cache=cache, metrics=metrics)
            plain = await ab.gather(backend, requests)
        finally:
            await backend.aclose()
    assert server.uploads == 2 and server.created == 2  # nothing uploaded or started again
    assert [b["request_counts"]["total"] for b in server.batches.values()] == [500, 500]
    assert len(server.batch_answered) == 1000 and set(server.batch_answered.values()) == {1}
    assert len(server.plain_answered) == 1000 and set(server.plain_answered.values()) == {1}
    assert_same(resumed, plain)
    assert [r.request_id for r in resumed] == [r.request_id for r in requests]
    assert metrics.successes == 1000 and metrics.cache_hits == 0


async def test_a_recorded_batch_the_provider_no_longer_knows_is_sent_again(tmp_path: Path) -> None:
    cache = tmp_path / "run.sqlite"
    requests = [ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=3)) for i in range(3)]
    async with FakeOpenAIBatchServer(hold=True) as server:
        backend = await backend_on(server)
        try:
            run = asyncio.ensure_future(ab.gather(backend, requests, batch=True, cache=cache))
            await server.wait_until(lambda s: sum(s.polls.values()) >= 1)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            with sqlite3.connect(cache) as db:
                db.execute("UPDATE batches SET batch_id = 'batch_deleted'")
            first = await ab.gather(backend, requests, batch=True, cache=cache, return_exceptions=True)
            server.release()
            second = await ab.gather(backend, requests, batch=True, cache=cache)
            plain = await ab.gather(backend, requests)
        finally:
            await backend.aclose()
    assert all(isinstance(e, ab.RequestRejectedError) and "no such batch" in str(e) for e in first)
    assert second == plain and server.created == 2 and server.uploads == 2


async def test_the_openai_sdk_drives_the_look_alike(server: FakeOpenAIBatchServer) -> None:
    """OpenAI's own client, an independent reading of the spec: its types parse every object served."""
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(base_url=server.url, api_key="sk-test", max_retries=0)
    try:
        lines = [
            {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": server.model, "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 3}}
            for i in range(3)
        ]  # fmt: skip
        lines[2]["body"]["messages"][0]["content"] = "no [reject]"
        content = "".join(json.dumps(line) + "\n" for line in lines).encode()
        uploaded = await client.files.create(file=("in.jsonl", content), purpose="batch")
        assert uploaded.purpose == "batch" and uploaded.bytes == len(content)
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await server.wait_until(lambda s: s.batches[batch.id]["status"] == "completed")
        done = await client.batches.retrieve(batch.id)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
            3,
            2,
            1,
        )
        listed = [b.id async for b in client.batches.list(limit=1)]
        assert listed == [batch.id]
        assert done.output_file_id is not None and done.error_file_id is not None
        output = (await client.files.content(done.output_file_id)).text.splitlines()
        errors = (await client.files.content(done.error_file_id)).text.splitlines()
        plain = await client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "hi 0"}], max_tokens=3
        )
    finally:
        await client.close()
    # Validated (the client itself parses leniently): every batch and file object served.
    for served in server.batches.values():
        openai.types.Batch.model_validate(served)
    for served in server.files.values():
        openai.types.FileObject.model_validate(served)
    answers = {json.loads(x)["custom_id"]: json.loads(x) for x in output + errors}
    assert set(answers) == {"c0", "c1", "c2"}
    first = openai.types.chat.ChatCompletion.model_validate(answers["c0"]["response"]["body"])
    assert first.choices[0].message.content == plain.choices[0].message.content
    assert answers["c2"]["response"]["status_code"] == 400 and answers["c2"]["error"] is None


async def test_a_batch_cancelled_elsewhere_fails_its_requests_retryably() -> None:
    requests = [ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=3)) for i in range(3)]
    async with FakeOpenAIBatchServer(hold=True) as server:
        backend = await backend_on(server)
        try:
            run = asyncio.ensure_future(ab.gather(backend, requests, batch=True, return_exceptions=True))
            await server.wait_until(lambda s: sum(s.polls.values()) >= 1)
            next(iter(server.batches.values()))["status"] = "cancelling"  # as a cancel from the dashboard
            server.release()
            results = await run
        finally:
            await backend.aclose()
    assert all(type(r) is ab.BackendError and r.retryable and "batch_cancelled" in str(r) for r in results)
    assert next(iter(server.batches.values()))["status"] == "cancelled" and not server.answered


async def test_put_many_stores_a_batch_in_one_transaction(tmp_path: Path) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    backend = ab.create_backend("mock")
    try:
        greedy = ab.GenerationRequest("a", ab.SamplingParams(max_tokens=2), request_id="x")
        unseeded = ab.GenerationRequest("b", ab.SamplingParams(max_tokens=2, temperature=1.0))
        result = ab.GenerationResult("x", (ab.Completion("done", (1, 2)),), 3, "m")
        cache.put_many(backend, [(greedy, result), (unseeded, result)])
        assert (
            len(cache) == 1 and cache.get(backend, greedy) == result and cache.get(backend, unseeded) is None
        )
    finally:
        cache.close()
        await backend.aclose()


async def test_a_raised_error_leaves_the_rest_stored_and_the_rerun_sends_only_the_failed(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "run.sqlite"
    requests = [
        ab.GenerationRequest("fine" if i % 3 else f"bad {i} [reject]", ab.SamplingParams(max_tokens=2))
        for i in range(6)
    ]
    async with FakeOpenAIBatchServer() as server:
        backend = await backend_on(server)
        try:
            with pytest.raises(ab.RequestRejectedError, match=r"bad 0 \[reject\]|refused"):
                await ab.gather(backend, requests, batch=True, cache=cache)
            assert recorded(cache, backend) == []
            again = await ab.gather(backend, requests, batch=True, cache=cache, return_exceptions=True)
        finally:
            await backend.aclose()
    assert [isinstance(r, ab.RequestRejectedError) for r in again] == [i % 3 == 0 for i in range(6)]
    assert [b["request_counts"]["total"] for b in server.batches.values()] == [6, 2]  # only the failed again


async def cancel_once_polled(
    server: FakeOpenAIBatchServer, backend: OpenAIBackend, requests: list[ab.GenerationRequest], cache: Path
) -> None:
    """A run on ``cache`` cancelled at its first poll (by then it has created every batch it needs)."""
    polled = sum(server.polls.values())
    run = asyncio.ensure_future(ab.gather(backend, requests, batch=True, cache=cache))
    await server.wait_until(lambda s: sum(s.polls.values()) > polled)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


def prompts(*names: str) -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"prompt {n}", ab.SamplingParams(max_tokens=3), request_id=n) for n in names]


@pytest_asyncio.fixture
async def held() -> AsyncIterator[tuple[FakeOpenAIBatchServer, OpenAIBackend]]:
    """A look-alike holding its batches until released, and a backend on it."""
    async with FakeOpenAIBatchServer(hold=True) as server:
        backend = await backend_on(server)
        try:
            yield server, backend
        finally:
            await backend.aclose()


async def test_a_batch_adopted_by_a_run_with_fewer_requests_stores_every_answer(
    tmp_path: Path, held: tuple[FakeOpenAIBatchServer, OpenAIBackend]
) -> None:
    """Issue 53 item 3: run 1 sends [A, B] and is cancelled; run 2 sends [A]; run 3 sends [B]: one upload."""
    cache = tmp_path / "run.sqlite"
    server, backend = held
    await cancel_once_polled(server, backend, prompts("A", "B"), cache)
    server.release()
    second = await ab.gather(backend, prompts("A"), batch=True, cache=cache)
    third = await ab.gather(backend, prompts("B"), batch=True, cache=cache)
    plain = await ab.gather(backend, prompts("A", "B"))
    assert [*second, *third] == plain
    assert server.uploads == 1 and server.created == 1
    assert sorted(server.batch_answered.values()) == [1, 1]
    assert recorded(cache, backend) == []


async def test_overlapping_and_disjoint_runs_on_one_cache_send_nothing_twice(
    tmp_path: Path, held: tuple[FakeOpenAIBatchServer, OpenAIBackend]
) -> None:
    """Runs cancelled mid-batch with request sets that overlap ([A, B], [B, C]) or not ([D]), then resumed."""
    cache = tmp_path / "run.sqlite"
    server, backend = held
    await cancel_once_polled(server, backend, prompts("A", "B"), cache)
    await cancel_once_polled(server, backend, prompts("B", "C"), cache)  # adopts B's, uploads C
    assert server.uploads == 2 and len(recorded(cache, backend)) == 2
    server.release()
    disjoint = await ab.gather(backend, prompts("D"), batch=True, cache=cache)
    assert len(recorded(cache, backend)) == 2  # the killed runs' batches, left for their requests
    fourth = await ab.gather(backend, prompts("A", "C", "D"), batch=True, cache=cache)
    metrics = ab.RunMetrics()
    everything = await ab.gather(
        backend, prompts("A", "B", "C", "D"), batch=True, cache=cache, metrics=metrics
    )
    plain = await ab.gather(backend, prompts("A", "B", "C", "D"))
    assert everything == plain and disjoint == plain[3:] and fourth == [plain[0], plain[2], plain[3]]
    assert metrics.cache_hits == 4  # B too: stored by the run that adopted its batch for A
    assert server.uploads == 3 and server.created == 3
    assert len(server.batch_answered) == 4 and set(server.batch_answered.values()) == {1}
    assert recorded(cache, backend) == []


async def test_a_record_whose_answers_are_all_stored_is_forgotten_by_the_next_run(tmp_path: Path) -> None:
    """A run killed after storing a batch's results but before dropping its record (two transactions)."""
    path = tmp_path / "run.sqlite"
    async with FakeOpenAIBatchServer() as server:
        backend = await backend_on(server)
        try:
            answers = await ab.gather(backend, prompts("A", "B"), batch=True, cache=path)
            cache = ab.ResponseCache(path)
            try:
                ids = tuple(f"{ab.ResponseCache.key(cache, backend, r)}-0" for r in prompts("A", "B"))
                cache.add_batch(backend, BatchRecord("file-000001", "/v1/completions", "batch_1", ids))
            finally:
                cache.close()
            other = await ab.gather(backend, prompts("C"), batch=True, cache=path)
        finally:
            await backend.aclose()
    assert recorded(path, backend) == []
    assert len(answers) == 2 and len(other) == 1 and server.uploads == 2


async def test_an_upload_in_progress_ends_when_the_backend_is_closed() -> None:
    """The upload goes through the backend's transport: aclose() ends it even while its answer is read."""
    from aiohttp import web

    from asyncbackends.testing._serve import serve

    async def stalled_upload(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"id": "file-')  # the rest never comes
        answering.set()
        await asyncio.Event().wait()
        return response

    async def scenario() -> None:
        # On the shared loop, where the backend's session lives and gather would call it.
        app = web.Application()
        app.router.add_post("/v1/files", stalled_upload)
        runner, port = await serve(app)
        backend = await ab.acreate_backend("openai", base_url=f"http://127.0.0.1:{port}/v1", model="m")
        try:
            assert isinstance(backend, OpenAIBackend)
            line = backend.batch_line("c-0", ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=2)))
            assert line is not None
            upload = asyncio.ensure_future(backend.upload_batch_file([line]))
            await answering.wait()
            await backend.aclose()
            # Posted outside the transport, the upload leaked aiohttp's RuntimeError or waited forever.
            with pytest.raises(ab.BackendClosedError):
                await asyncio.wait_for(upload, 20)
        finally:
            await backend.aclose()
            await runner.cleanup()

    answering = asyncio.Event()
    await ab.get_loop_manager().arun(scenario())


async def test_a_batch_run_finds_its_cached_part_a_chunk_of_keys_per_query(
    server: FakeOpenAIBatchServer, tmp_path: Path
) -> None:
    requests = [ab.GenerationRequest(f"p{i}", ab.SamplingParams(max_tokens=3)) for i in range(1_000)]
    backend = await backend_on(server)
    cache = ab.ResponseCache(tmp_path / "run.sqlite")
    try:
        first = await ab.gather(backend, requests, batch=True, cache=cache)
        selects: list[str] = []
        cache._db.set_trace_callback(lambda s: selects.append(s) if s.lstrip().startswith("SELECT") else None)
        metrics = ab.RunMetrics()
        again = await ab.gather(backend, requests, batch=True, cache=cache, metrics=metrics)
    finally:
        cache.close()
        await backend.aclose()
    assert again == first and metrics.cache_hits == 1_000 and server.uploads == 1
    assert len(selects) <= 10  # one per request before: 1,000


async def test_a_batch_run_is_priced_at_the_batch_discount(server: FakeOpenAIBatchServer) -> None:
    prices = ab.Pricing(input=2.0, output=8.0, batch=0.5)
    backend = await backend_on(server, pricing=prices)
    requests = [ab.GenerationRequest(f"price me {i}", ab.SamplingParams(max_tokens=4)) for i in range(6)]
    try:
        batch_metrics, plain_metrics = ab.RunMetrics(), ab.RunMetrics()
        batch = await ab.gather(backend, requests, batch=True, metrics=batch_metrics)
        await ab.gather(backend, requests, metrics=plain_metrics)
    finally:
        await backend.aclose()
    # The look-alike's usage records, at the stated prices per 1M tokens, halved for the batch.
    full = sum(r.prompt_tokens * 2.0 + r.completion_tokens * 8.0 for r in batch) / 1_000_000  # type: ignore[operator]
    assert batch_metrics.cost is not None and plain_metrics.cost is not None
    assert abs(batch_metrics.cost - full / 2) < 1e-15
    assert abs(plain_metrics.cost - full) < 1e-15
