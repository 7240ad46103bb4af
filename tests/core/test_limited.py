"""`ab.limited`: limits that hold across every run using the wrapped backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._protocol import SupportsFingerprint, SupportsRollingLoglikelihood


def requests(n: int, prefix: str = "p") -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"{prefix}{i}", request_id=f"{prefix}{i}") for i in range(n)]


class Server(ab.BaseBackend):
    """Records what is in flight and when each request started."""

    name = "server"

    def __init__(self, service: float = 0.01) -> None:
        self.service = service
        self.in_flight = self.max_in_flight = 0
        self.starts: list[float] = []
        self.closed_calls = 0
        self.capabilities = ab.Capabilities(loglikelihood=True, rolling_loglikelihood=True)

    async def _serve(self) -> None:
        self.starts.append(time.monotonic())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.service)
        finally:
            self.in_flight -= 1

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        await self._serve()
        return ab.GenerationResult(request.request_id, (ab.Completion(str(request.prompt)),))

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        await self._serve()
        return ab.LoglikelihoodResult(request.request_id, -1.0)

    async def loglikelihood_rolling(self, request: ab.RollingLoglikelihoodRequest) -> ab.LoglikelihoodResult:
        await self._serve()
        return ab.LoglikelihoodResult(request.request_id, -2.0)

    @property
    def fingerprint(self) -> Mapping[str, Any]:
        return MappingProxyType({"model": "m"})

    async def _aclose(self) -> None:
        self.closed_calls += 1


async def _two_runs(backend: ab.AsyncBackend, n: int, **options: Any) -> tuple[list[Any], list[Any]]:
    return await asyncio.gather(
        ab.gather(backend, requests(n, "a"), **options), ab.gather(backend, requests(n, "b"), **options)
    )


def test_two_concurrent_runs_share_the_concurrency_limit() -> None:
    server = Server(service=0.02)
    shared = ab.limited(server, concurrency=4)
    a, b = asyncio.run(_two_runs(shared, 40, concurrency=16))
    assert [r.text for r in a] == [f"a{i}" for i in range(40)] and [r.text for r in b][-1] == "b39"
    assert server.max_in_flight == 4  # never above the limit, and the limit was reached


def test_without_the_wrapper_each_run_gets_its_own_limit() -> None:
    # The defect ab.limited fixes: gather's concurrency is per run, so two runs double it.
    server = Server(service=0.05)
    asyncio.run(_two_runs(server, 16, concurrency=4))
    assert server.max_in_flight == 8


def test_two_concurrent_runs_share_the_request_rate() -> None:
    rate = 40.0
    server = Server(service=0.0)
    shared = ab.limited(server, rate_limit=ab.RateLimit(requests_per_second=rate))
    start = time.monotonic()
    asyncio.run(_two_runs(shared, 50))  # 100 requests, each run free to go as fast as it likes
    elapsed = time.monotonic() - start
    # The bucket starts with one second's worth (40): the other 60 need at least 60 / 40 s.
    assert elapsed >= (100 - rate) / rate * 0.98
    starts = sorted(server.starts)
    assert len(starts) == 100
    # In any window of w seconds at most the burst plus w seconds' worth start (+1 for the edge).
    for i, t in enumerate(starts):
        for j in range(i, len(starts)):
            window = starts[j] - t
            assert j - i + 1 <= rate + rate * window + 1


def test_shared_tokens_per_minute() -> None:
    server = Server(service=0.0)
    # 60 tokens a request (1 prompt + 59 max), 3600 tokens a minute = 60 tokens/s with a 3600 burst:
    # 60 requests pass at once, the 4 more need 4 s... keep it short: 62 requests, 2 wait 1 s each.
    shared = ab.limited(server, rate_limit=ab.RateLimit(tokens_per_minute=3600))
    batch = [ab.GenerationRequest("abcd", ab.SamplingParams(max_tokens=59)) for _ in range(31)]
    start = time.monotonic()

    async def both() -> None:
        await asyncio.gather(ab.gather(shared, batch), ab.gather(shared, batch))

    asyncio.run(both())
    assert time.monotonic() - start >= 2 * 0.98


def test_waiting_for_the_shared_limits_is_not_timed() -> None:
    # Two slots of 0.3 s for 16 requests in flight, and a rate of 10/s for 30 requests (a burst of 10): the
    # last ones wait 2.1 s and 2 s, well past the 1.2 s and 1 s timeouts, but only time holding a slot is
    # timed. The timeouts leave a loaded machine's stalls 0.9 s and 1 s of room on each request's own time.
    server = Server(service=0.3)
    shared = ab.limited(server, concurrency=2)
    outcomes = ab.run_batch(
        shared, requests(16), concurrency=16, timeout=1.2, retry=ab.RetryPolicy(max_attempts=1)
    )
    assert len(outcomes) == 16 and server.max_in_flight == 2

    quick = Server(service=0.0)
    paced = ab.limited(quick, rate_limit=ab.RateLimit(requests_per_second=10))
    outcomes = ab.run_batch(paced, requests(30), timeout=1.0, retry=ab.RetryPolicy(max_attempts=1))
    assert len(outcomes) == 30


def test_a_hung_request_holding_a_shared_slot_still_times_out() -> None:
    server = Server(service=3600)
    shared = ab.limited(server, concurrency=1)
    outcomes = ab.run_batch(
        shared, requests(2), timeout=0.2, retry=ab.RetryPolicy(max_attempts=1), return_exceptions=True
    )
    assert all(isinstance(o, ab.BackendTimeoutError) for o in outcomes)
    assert server.in_flight == 0


def test_name_capabilities_fingerprint_methods_and_aclose_pass_through(tmp_path: Any) -> None:
    server = Server()
    shared = ab.limited(server, concurrency=2)
    assert shared.name == "server" and shared.capabilities is server.capabilities
    assert isinstance(shared, ab.AsyncBackend) and isinstance(shared, SupportsFingerprint)
    assert shared.fingerprint == {"model": "m"}
    assert isinstance(shared, SupportsRollingLoglikelihood)
    mixed: list[ab.Request] = [
        ab.GenerationRequest("g"),
        ab.LoglikelihoodRequest("c", "x"),
        ab.RollingLoglikelihoodRequest("t"),
    ]
    path = tmp_path / "c.sqlite"
    first = ab.run_batch(shared, mixed, cache=path)
    assert [type(r).__name__ for r in first] == [
        "GenerationResult",
        "LoglikelihoodResult",
        "LoglikelihoodResult",
    ]
    metrics = ab.RunMetrics()
    ab.run_batch(server, mixed, cache=path, metrics=metrics)
    assert metrics.cache_hits == 3  # one cache key for the backend and its wrapper

    class NoRolling:
        name = "no-rolling"
        capabilities = ab.Capabilities()

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            raise NotImplementedError

        async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
            raise NotImplementedError

        async def aclose(self) -> None:
            return None

    plain = ab.limited(NoRolling())
    assert not isinstance(plain, SupportsRollingLoglikelihood) and plain.fingerprint is None

    ab.get_loop_manager().run(shared.aclose())
    assert server.closed and server.closed_calls == 1


@pytest.mark.parametrize(
    "options",
    [{"concurrency": 0}, {"concurrency": True}, {"concurrency": 1.5}, {"rate_limit": 5}],
)
def test_bad_limits_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ab.InvalidRequestError):
        ab.limited(Server(), **options)
