"""Write a run's metrics file and its HTML report, as `asyncbackends run --metrics-file` + `report` do.

The backend stands in for a pool of three replicas of one model: each request goes to one of them, one
replica is slower, one answers "429 Too Many Requests" now and then (retried after its Retry-After), and a
few requests fail for good. Usage: ``python examples/observability_report.py [OUT_DIR]``; the screenshot in
docs/observability.md is this report.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

import asyncbackends as ab
from asyncbackends._observability.observe import note_replica
from asyncbackends._observability.report import write_report
from asyncbackends._observability.runlog import RunLog

REPLICAS = {"http://gpu-a:8000": 0.05, "http://gpu-b:8000": 0.05, "http://gpu-c:8000": 0.12}


class ThreeReplicas(ab.BaseBackend):
    name = "pool"
    capabilities = ab.Capabilities(max_concurrency=32)
    model = "Qwen/Qwen2.5-7B-Instruct"

    def __init__(self) -> None:
        self.rng = random.Random(0)

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        replica = self.rng.choice(list(REPLICAS))
        note_replica(replica)
        await asyncio.sleep(REPLICAS[replica] * self.rng.uniform(0.5, 2.0))
        roll = self.rng.random()
        if replica.startswith("http://gpu-b") and roll < 0.15:
            raise ab.RateLimitedError("429 Too Many Requests", retry_after=0.2)
        if roll < 0.02:
            raise ab.BackendUnavailableError("503 Service Unavailable")
        if roll < 0.03:
            raise ab.RequestRejectedError("prompt too long")
        tokens = self.rng.randint(16, 64)
        completion = ab.Completion("x" * tokens, tuple(range(tokens)), None, "stop")
        return ab.GenerationResult(request.request_id, (completion,), prompt_tokens=40, model=self.model)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    backend = ThreeReplicas()
    requests = [ab.GenerationRequest(f"question {i}", request_id=str(i)) for i in range(1500)]
    metrics = ab.RunMetrics()
    retry = ab.RetryPolicy(max_attempts=3, initial_delay=0.1)
    with RunLog(out / "run.jsonl", backend, len(requests)) as run_log:
        ab.run_batch(
            backend,
            requests,
            retry=retry,
            callbacks=run_log.callbacks,
            metrics=metrics,
            return_exceptions=True,
        )
        run_log.close(metrics.summary())
    write_report(out / "run.jsonl", out / "report.html")
    print(f"{out / 'report.html'}\n{metrics.format()}")


if __name__ == "__main__":
    main()
