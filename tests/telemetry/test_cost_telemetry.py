"""Usage and cost in a run's outputs: spans, the metrics file, the report, the CLI's summary and records."""

from __future__ import annotations

from pathlib import Path

import asyncbackends as ab
from asyncbackends._observability.report import load_run, render_report
from asyncbackends._observability.runlog import RunLog

from .conftest import OTel

PRICES = ab.Pricing(input=3.0, cached_input=0.3, output=15.0, per=1000)


class Cached(ab.BaseBackend):
    """Answers with a usage of its own: 100 prompt tokens, 80 of them cached, 10 generated."""

    name = "cached"

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self._check_open(request.request_id)
        completion = ab.Completion("x" * 10, tuple(range(10)), None, "length")
        return ab.GenerationResult(request.request_id, (completion,), 100, "m", cached_prompt_tokens=80)


def test_spans_carry_the_cached_input_tokens_and_the_cost(otel: OTel) -> None:
    backend = Cached()
    backend.pricing = PRICES
    ab.run_batch(backend, [ab.GenerationRequest("a"), ab.GenerationRequest("b")])
    spans = [s for s in otel.finished() if s.attributes and "gen_ai.usage.input_tokens" in s.attributes]
    assert len(spans) == 2
    for span in spans:
        assert span.attributes is not None
        assert span.attributes["gen_ai.usage.cache_read.input_tokens"] == 80
        # 20 uncached at 3.0, 80 cached at 0.3, 10 out at 15.0, per 1000 tokens: by hand, 0.234.
        assert abs(float(span.attributes["asyncbackends.cost"]) - 0.234) < 1e-12  # type: ignore[arg-type]


def test_the_metrics_file_and_the_report_carry_the_cached_share_and_the_cost(tmp_path: Path) -> None:
    backend = Cached()
    backend.pricing = PRICES
    path = tmp_path / "run.jsonl"
    metrics = ab.RunMetrics()
    with RunLog(path, backend, 3) as run_log:
        ab.run_batch(backend, [ab.GenerationRequest(str(i)) for i in range(3)], callbacks=run_log.callbacks,
                     metrics=metrics)  # fmt: skip
        run_log.close(metrics.summary())
    data = load_run(path)
    assert [r["cached_input_tokens"] for r in data.requests] == [80, 80, 80]
    assert data.end is not None and abs(data.end["summary"]["cost"] - 3 * 0.234) < 1e-12
    html = render_report(data)
    assert "<td>of which read from a cache</td><td>240 (80% of the prompt tokens)</td>" in html
    assert "<td>cost (at the stated prices)</td><td>0.7020</td>" in html
    assert "prompt: 300 tokens, 240 cached (80%)  cost: 0.7020" in metrics.format()
