"""inspect's usage records carry the cached prompt tokens and the cost at the backend's stated prices."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate

import asyncbackends as ab
from asyncbackends.integrations import _inspect_convert as convert

pytestmark = pytest.mark.filterwarnings("ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning")


def test_a_results_cached_tokens_and_cost_reach_inspects_usage() -> None:
    completion = ab.Completion("four", (1, 2, 3, 4), None, "stop")
    result = ab.GenerationResult("r", (completion,), 1200, "m", cached_prompt_tokens=1024)
    prices = ab.Pricing(input=2.0, cached_input=0.5, output=8.0)
    output = convert.model_output(
        result, model="m", tools=[], input_tokens=1200, output_tokens=lambda c: len(c.token_ids),
        token_text=str, pricing=prices,
    )  # fmt: skip
    usage = output.usage
    assert usage is not None
    assert (usage.input_tokens, usage.input_tokens_cache_read, usage.output_tokens) == (1200, 1024, 4)
    # 176 uncached at 2.0, 1024 cached at 0.5, 4 out at 8.0, per 1M: by hand.
    assert usage.total_cost == pytest.approx((176 * 2.0 + 1024 * 0.5 + 4 * 8.0) / 1e6, rel=1e-12)


def test_an_eval_on_a_priced_backend_reports_its_cost(tmp_path: Path) -> None:
    inputs = ["alpha", "beta gamma", "delta"]
    task = Task(dataset=[Sample(input=t, target=t) for t in inputs], solver=[generate()], scorer=includes())
    # The mock reads one character as one token and echoes its rendered prompt: counts a test can predict.
    (log,) = eval(
        task, model="asyncbackends/mock", model_args={"pricing": {"input": 3.0, "output": 5.0}},
        log_dir=str(tmp_path / "logs"), display="none",
    )  # fmt: skip
    assert log.status == "success"
    usage = next(iter(log.stats.model_usage.values()))
    expected = (usage.input_tokens * 3.0 + usage.output_tokens * 5.0) / 1e6
    assert usage.input_tokens > 0 and usage.total_cost == pytest.approx(expected, rel=1e-12)
