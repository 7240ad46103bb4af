"""End to end on the real engine: inspect, lm-eval and lighteval score the tiny reasoning model's answer alone.

inspect runs on the backend with vLLM's ``deepseek_r1`` reasoning parser: its log must hold the thought as
`ContentReasoning` and its score read the answer alone.

The session's plain `vllm` backend on the tiny reasoning model (no reasoning parser) returns the thought and
its ``</think>`` in the text; its chat template opens the thought, so some greedy thoughts close within the
task's 32 tokens and others are cut off. lm-eval's ``think_end_token`` and lighteval's ``reasoning_tags``
must score what follows ``</think>``, cut at the task's stop, and an unclosed thought as an empty answer.
The reference: the same engine asked directly for the same chat with no stop strings, split by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")

import lm_eval
from lm_eval.tasks import TaskManager

import asyncbackends as ab
from asyncbackends.integrations._lm_eval_chat import chat_prompt
from asyncbackends.integrations.lm_eval import AsyncBackendsLM

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    # vLLM's engine shutdown leaves a ZMQ context for the garbage collector (reported to the adapter).
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

LM_EVAL_TASKS = Path(__file__).resolve().parent.parent / "data" / "lm_eval_tasks"
MAX_TOKENS = 32  # the ab_think tasks' limit


def _raw(engine: Any, prompt: Any) -> str:
    """The engine's own greedy text for ``prompt``, asked directly with no stop strings."""
    return str(
        ab.run_batch(engine, [ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=MAX_TOKENS))])[0].text
    )


@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("tiny_reasoning_vllm_engine")


def test_lm_eval_think_end_token_scores_the_answer_and_unclosed_thoughts_as_empty(engine: Any) -> None:
    results = lm_eval.simple_evaluate(
        model=AsyncBackendsLM(engine, think_end_token="</think>", progress=False),  # shared: never closed
        tasks=["ab_think"],
        task_manager=TaskManager(include_path=str(LM_EVAL_TASKS), include_defaults=False),
        apply_chat_template=True,
        log_samples=True,
    )
    assert results is not None
    samples = results["samples"]["ab_think"]
    closed = []
    hits = 0
    for sample in samples:
        context = sample["arguments"][0][0]  # (context, gen_kwargs) of its one request
        raw = _raw(engine, chat_prompt(context, None))
        closed.append("</think>" in raw)
        # lm-eval's rule: what follows the last </think>, left-stripped, cut at the task's "\n".
        answer = raw.rpartition("</think>")[2].lstrip().split("\n")[0] if closed[-1] else ""
        assert sample["filtered_resps"][0] == answer
        hits += answer == sample["target"]
    # The tiny model closes some thoughts within 32 tokens and not others: both paths were exercised.
    assert any(closed) and not all(closed), closed
    assert results["results"]["ab_think"]["exact_match,none"] == pytest.approx(hits / len(samples))


def test_lighteval_reasoning_tags_score_the_answer_and_unclosed_thoughts_as_empty(
    engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("lighteval")
    from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

    from .lighteval_helpers import custom_tasks_only, details, run_pipeline

    custom_tasks_only(monkeypatch)
    config = AsyncBackendsModelConfig(
        model_name="tiny-reasoning",
        cache_dir=str(tmp_path / "cache"),
        progress=False,
        use_chat_template=True,
        reasoning_tags=[("<think>", "</think>")],
    )
    model = AsyncBackendsModel(config, backend=engine)  # wraps the shared engine: left open
    pipeline = run_pipeline("ab_think|0", tmp_path / "out", model=model)
    closed = []
    for doc, response in details(pipeline, "ab_think|0"):
        raw = _raw(engine, [{"role": "user", "content": doc.query}])
        closed.append("</think>" in raw)
        # vLLM's deepseek_r1 rule for a template-opened thought: what follows the first </think> (lighteval
        # sends no task stops with a chat template).
        answer = raw.partition("</think>")[2] if closed[-1] else ""
        assert response.final_text[0] == answer
    assert any(closed) and not all(closed), closed


def test_inspect_log_holds_the_thought_and_the_score_reads_the_answer(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    pytest.importorskip("inspect_ai")
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.log import read_eval_log
    from inspect_ai.model import ContentReasoning, GenerateConfig
    from inspect_ai.scorer import exact
    from inspect_ai.solver import generate

    from asyncbackends.integrations.inspect_ai import inspect_model

    engine = request.getfixturevalue("tiny_reasoning_parser_engine")
    questions = ["What is two plus two?", "Name the capital of France.", "hello there", "Tell me a story."]
    # 16 tokens: the tiny model closes some of these thoughts within them and not others (its own tests).
    params = ab.SamplingParams(max_tokens=16)
    direct = ab.run_batch(
        engine, [ab.GenerationRequest([{"role": "user", "content": q}], params) for q in questions]
    )
    references = [r.completions[0] for r in direct]
    # The target is what a scorer should read: the answer where the thought closed; the thought where it was
    # cut off, which must then score wrong (the answer is empty, never the thought).
    samples = [
        Sample(input=q, target=c.reasoning if c.reasoning_truncated else c.text, id=i)
        for i, (q, c) in enumerate(zip(questions, references, strict=True))
    ]
    model = inspect_model(engine, config=GenerateConfig(max_tokens=16))
    logs = eval(
        Task(dataset=samples, solver=[generate()], scorer=exact()),
        model=model,
        log_dir=str(tmp_path / "logs"),
        display="none",
    )
    assert logs[0].status == "success", logs[0].error
    log = read_eval_log(logs[0].location)
    assert log.samples is not None and len(log.samples) == len(questions)
    for sample in log.samples:
        reference = references[int(sample.id)]
        content = sample.output.message.content
        assert isinstance(content, list) and isinstance(content[0], ContentReasoning)
        assert content[0].reasoning == reference.reasoning
        assert sample.output.completion == reference.text
        assert sample.output.usage is not None
        assert sample.output.usage.reasoning_tokens == reference.reasoning_tokens > 0
        assert sample.scores is not None
        if reference.reasoning_truncated:
            assert sample.output.completion == "" and sample.output.stop_reason == "max_tokens"
            assert sample.scores["exact"].value == "I"
        else:
            assert sample.scores["exact"].value == "C"
    truncated = [c.reasoning_truncated for c in references]
    assert any(truncated) and not all(truncated), truncated
