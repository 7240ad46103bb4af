"""Faults: a flaky TGI look-alike, 10k requests, nothing lost, nothing duplicated, nothing hung.

The look-alike serves on the test's own loop (the main thread); the adapter runs on the shared loop (its
thread), so client and server really talk over loopback sockets.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import asyncbackends as ab
from asyncbackends.testing.fake_tgi import FakeTGIServer, Limits

pytestmark = pytest.mark.asyncio


def _prompts(n: int) -> list[ab.GenerationRequest]:
    return [
        ab.GenerationRequest(f"{i:05d}: a prompt", ab.SamplingParams(max_tokens=5), request_id=str(i))
        for i in range(n)
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_10k_requests_under_30_percent_faults_complete_exactly_once_in_order() -> None:
    n = 10_000
    faulty = FakeTGIServer(
        rate_429=0.15,
        rate_503=0.13,
        drop_rate=0.015,
        hang_rate=0.005,
        limits=Limits(max_concurrent_requests=1024),
        check_schema=False,
        record=False,
        seed=1,
    )
    async with faulty:
        backend = await ab.acreate_backend("tgi", url=faulty.url, token=False)
        retry = ab.RetryPolicy(max_attempts=12, initial_delay=0.005, max_delay=0.05)
        metrics = ab.RunMetrics()
        start = time.perf_counter()
        outcomes = await ab.gather(
            backend,
            _prompts(n),
            concurrency=64,
            timeout=0.5,
            retry=retry,
            return_exceptions=True,
            metrics=metrics,
        )
        elapsed = time.perf_counter() - start
        await backend.aclose()

    assert len(outcomes) == n
    failed = [o for o in outcomes if isinstance(o, ab.AsyncBackendsError)]
    # With 30% of attempts failing, 12 attempts leave about 10k * 0.3^12 = 0.005 requests failed.
    assert failed == []
    assert [o.request_id for o in outcomes] == [str(i) for i in range(n)]
    assert [o.text for o in outcomes] == [f"{i:05d}" for i in range(n)]  # the look-alike echoes greedily
    # The server answered every input at least once; an answer more is a reply that arrived after the
    # client's per-attempt timeout had already given up on it (at-least-once is all a client can know).
    assert n <= faulty.statuses[200] <= n + metrics.retried_errors["BackendTimeoutError"]
    attempts = sum(faulty.attempts.values())
    # Every attempt the server saw was one the client made; a few client attempts never reach the handler
    # (a pooled connection the server had just dropped), and those were retried as unavailable.
    assert n + metrics.retries - metrics.retried_errors["BackendUnavailableError"] <= attempts
    assert attempts <= n + metrics.retries
    assert max(faulty.attempts.values()) <= retry.max_attempts
    assert 0.25 < metrics.retries / attempts < 0.40  # the injected fault rate, seen from the client
    assert metrics.errors == {}
    print(f"\n10k under faults: {elapsed:.1f} s, {dict(metrics.retried_errors)}, {dict(faulty.statuses)}")


async def test_exhausted_retries_fail_only_that_request() -> None:
    bad = FakeTGIServer(fail_attempts=100, failure=503, check_schema=False)
    good = FakeTGIServer(check_schema=False)
    async with bad, good:
        broken = await ab.acreate_backend("tgi", url=bad.url, token=False)
        healthy = await ab.acreate_backend("tgi", url=good.url, token=False)
        retry = ab.RetryPolicy(max_attempts=3, initial_delay=0.001)
        outcomes = await ab.gather(broken, _prompts(5), retry=retry, return_exceptions=True)
        assert all(isinstance(o, ab.BackendUnavailableError) for o in outcomes)
        assert [o.request_id for o in outcomes] == [str(i) for i in range(5)]
        assert sorted(bad.attempts.values()) == [3] * 5
        ok = await ab.gather(healthy, _prompts(5))
        assert len(ok) == 5
        await broken.aclose()
        await healthy.aclose()


async def test_retry_after_is_honoured_and_capped() -> None:
    async with FakeTGIServer(fail_attempts=1, failure=429, retry_after="0.4", check_schema=False) as server:
        backend = await ab.acreate_backend("tgi", url=server.url, token=False)
        start = time.perf_counter()
        await ab.gather(backend, _prompts(3), retry=ab.RetryPolicy(initial_delay=0, max_delay=10))
        assert time.perf_counter() - start >= 0.4
        await backend.aclose()
    async with FakeTGIServer(fail_attempts=1, failure=429, retry_after="3600", check_schema=False) as server:
        backend = await ab.acreate_backend("tgi", url=server.url, token=False)
        start = time.perf_counter()
        await ab.gather(backend, _prompts(3), retry=ab.RetryPolicy(initial_delay=0, max_delay=0.2))
        assert time.perf_counter() - start < 3  # an hour's Retry-After capped at max_delay
        await backend.aclose()


async def test_ctrl_c_closes_in_flight_http_requests() -> None:
    # A client process blocked in run_batch gets SIGINT: the server sees every connection closed (its
    # handlers cancelled), the client raises KeyboardInterrupt, and a second run_batch works.
    async with FakeTGIServer(latency=60, check_schema=False) as server:
        script = textwrap.dedent(
            f"""
            import asyncbackends as ab
            backend = ab.create_backend("tgi", url="{server.url}", token=False)
            requests = [ab.GenerationRequest(f"p{{i}}", ab.SamplingParams(max_tokens=2)) for i in range(10)]
            print("ready", flush=True)
            try:
                ab.run_batch(backend, requests, concurrency=10)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            """
        )
        process = subprocess.Popen(  # noqa: ASYNC220  (Popen returns at once; we wait in a thread)
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 30
        while server.in_flight < 10 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        assert server.in_flight == 10
        os.kill(process.pid, signal.SIGINT)
        while server.in_flight and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert server.in_flight == 0
        assert "interrupted" in out, err
        assert process.returncode == 0
