"""Per-replica adaptive limits in OpenTelemetry: a gauge per replica, its moves counted with the replica."""

from __future__ import annotations

import asyncio

import asyncbackends as ab

from .conftest import OTel
from .test_adaptive_telemetry import RefusesOnce


class YieldingRefusesOnce(RefusesOnce):
    """`RefusesOnce` that lets the loop run before it answers, so two attempts are in flight together."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        await asyncio.sleep(0)
        return await super().generate(request)


def test_each_replica_limit_is_a_gauge_and_its_moves_are_counted_with_the_replica(otel: OTel) -> None:
    refusing, serving = YieldingRefusesOnce(), YieldingRefusesOnce()
    serving.calls = 1  # its one refusal is behind it: it serves everything
    settings = ab.AdaptiveConcurrency(initial=10, backoff=0.5)
    pool = ab.pool([refusing, serving], replica_concurrency=settings)
    try:
        requests = [ab.GenerationRequest(str(i)) for i in range(6)]
        # Two at once: the second attempt goes to the replica the first left idle, so both are asked.
        results = ab.run_batch(pool, requests, concurrency=2, retry=ab.RetryPolicy(initial_delay=0.0))
        assert all(isinstance(r, ab.GenerationResult) for r in results)
        assert refusing.calls >= 1
        name = pool.router.name
        limits = {
            p.attributes["asyncbackends.replica"]: p.value
            for p in otel.points("asyncbackends.replica.concurrency.limit")
            if p.attributes["asyncbackends.pool"] == name
        }
        assert limits == {"refuses-once-0": 5, "refuses-once-1": 10}  # only the refusing replica was cut
        assert [s.limit for s in pool.replica_stats()] == [5, 10]
        moves = [
            (p.attributes["asyncbackends.replica"], p.attributes["asyncbackends.concurrency.reason"], p.value)
            for p in otel.points("asyncbackends.concurrency.changes")
            if p.attributes.get("asyncbackends.pool") == name
        ]
        assert moves == [("refuses-once-0", "rate_limited", 1)]
    finally:
        pool.close()
