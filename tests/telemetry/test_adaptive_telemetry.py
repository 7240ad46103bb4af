"""The adaptive concurrency limit in OpenTelemetry: a gauge of where it stands, a counter of its moves."""

from __future__ import annotations

import asyncbackends as ab

from .conftest import OTel


class RefusesOnce(ab.BaseBackend):
    """Answers 429 to the first call it gets, then serves everything."""

    name = "refuses-once"

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.calls += 1
        if self.calls == 1:
            raise ab.RateLimitedError("Model is overloaded")
        return ab.GenerationResult(request.request_id, (ab.Completion("ok"),))


def test_the_limit_and_its_changes_by_reason_are_metrics(otel: OTel) -> None:
    requests = [ab.GenerationRequest(str(i)) for i in range(4)]
    metrics = ab.RunMetrics()
    ab.run_batch(
        RefusesOnce(),
        requests,
        concurrency=ab.AdaptiveConcurrency(initial=10, backoff=0.5),
        retry=ab.RetryPolicy(initial_delay=0.0),
        metrics=metrics,
    )
    # One refusal cut 10 to 5; four answers are too few for a round, so nothing else moved it.
    assert metrics.limit_history == [(metrics.limit_history[0][0], 5, "rate_limited")]
    [limit] = otel.points("asyncbackends.concurrency.limit")
    assert limit.value == 5 and limit.attributes["gen_ai.provider.name"] == "refuses-once"
    [changes] = otel.points("asyncbackends.concurrency.changes")
    assert changes.value == 1 and changes.attributes["asyncbackends.concurrency.reason"] == "rate_limited"
