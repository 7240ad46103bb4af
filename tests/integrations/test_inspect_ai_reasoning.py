"""inspect_ai and reasoning models, on the mock that thinks (``thinking="split"``/``"inline"``): the thought in
`ContentReasoning`, the answer alone scored, reasoning config mapped, reasoning history as inspect resolves it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.log import EvalLog, ModelEvent, read_eval_log, resolve_sample_attachments
from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageUser,
    ContentReasoning,
    ContentText,
    GenerateConfig,
    Model,
    get_model,
)
from inspect_ai.scorer import exact
from inspect_ai.solver import Generate, Solver, TaskState, generate, solver

import asyncbackends as ab
from asyncbackends.integrations import _inspect_convert as convert

pytestmark = pytest.mark.filterwarnings("ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning")


@pytest.fixture
def make_model() -> Iterator[Any]:
    made: list[Model] = []

    def make(**kwargs: Any) -> Model:
        model = get_model("asyncbackends/mock", memoize=False, **kwargs)
        made.append(model)
        return model

    yield make
    for model in made:
        asyncio.run(model.__aexit__(None, None, None))


def _run(
    tmp_path: Path, model: Model, inputs: list[str], plan: Solver | None = None, **config: Any
) -> EvalLog:
    # The target is the mock's answer (it echoes its chat rendering): `exact` passes on the answer alone.
    task = Task(
        dataset=[Sample(input=text, target=f"user: {text}") for text in inputs],
        solver=[plan or generate()],
        scorer=exact(),
    )
    logs = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none", **config)
    assert len(logs) == 1 and logs[0].status == "success", logs[0].error
    return read_eval_log(logs[0].location)  # what was written, not what is in memory


def _thought(text: str) -> str:
    return f"user: {text}"[::-1]  # the mock thinks its prompt backwards (at the default effort)


def test_the_log_holds_the_thought_and_the_score_reads_the_answer_alone(
    tmp_path: Path, make_model: Any
) -> None:
    log = _run(tmp_path, make_model(thinking="split"), ["two plus two", "the capital of France"])
    assert log.samples is not None
    for sample in log.samples:
        message = sample.output.message
        assert isinstance(message.content, list)
        reasoning, answer = message.content
        assert isinstance(reasoning, ContentReasoning) and isinstance(answer, ContentText)
        assert reasoning.reasoning == _thought(str(sample.input))
        assert sample.output.completion == answer.text == f"user: {sample.input}"
        assert sample.scores is not None and sample.scores["exact"].value == "C"
        usage = sample.output.usage
        assert usage is not None and usage.reasoning_tokens == len(reasoning.reasoning)
        assert usage.output_tokens == len(reasoning.reasoning) + len(answer.text)


def test_without_a_split_the_thought_is_scored_and_fails(tmp_path: Path, make_model: Any) -> None:
    # The contrast: a backend that returns the thought inside its text (no reasoning parser).
    log = _run(tmp_path, make_model(thinking="inline"), ["two plus two"])
    assert log.samples is not None
    sample = log.samples[0]
    assert sample.output.completion == _thought("two plus two") + "</think>user: two plus two"
    assert sample.scores is not None and sample.scores["exact"].value == "I"


def test_cut_off_while_thinking_is_an_empty_answer_stopped_by_max_tokens(
    tmp_path: Path, make_model: Any
) -> None:
    log = _run(tmp_path, make_model(thinking="split"), ["a long enough question"], max_tokens=5)
    assert log.samples is not None
    output = log.samples[0].output
    assert output.stop_reason == "max_tokens"
    assert output.completion == ""
    content = output.message.content
    assert isinstance(content, list) and isinstance(content[0], ContentReasoning)
    assert content[0].reasoning == _thought("a long enough question")[:5]
    assert output.usage is not None and output.usage.reasoning_tokens == 5
    assert log.samples[0].scores is not None and log.samples[0].scores["exact"].value == "I"


@pytest.mark.parametrize(
    ("config", "params"),
    [
        ({"reasoning_effort": "low"}, {"reasoning_effort": "low"}),
        ({"reasoning_effort": "none"}, {"reasoning_effort": "none"}),
        ({"reasoning_tokens": 3}, {"thinking_budget": 3}),
        (
            {"reasoning_effort": "high", "reasoning_tokens": 7},
            {"reasoning_effort": "high", "thinking_budget": 7},
        ),
    ],
)
def test_reasoning_config_reaches_the_backend(
    tmp_path: Path, make_model: Any, config: dict[str, Any], params: dict[str, Any]
) -> None:
    model = make_model(thinking="split")
    log = _run(tmp_path, model, ["what is it"], **config)
    assert log.samples is not None
    # The reference: the backend called directly with this library's own parameters.
    request = ab.GenerationRequest([{"role": "user", "content": "what is it"}], ab.SamplingParams(**params))
    expected = ab.run_batch(model.api.backend, [request])[0].completions[0]  # type: ignore[attr-defined]
    output = log.samples[0].output
    assert output.usage is not None and output.usage.reasoning_tokens == expected.reasoning_tokens
    assert output.completion == expected.text
    assert expected.reasoning_tokens != len(_thought("what is it"))  # the setting changed the thought


def test_efforts_beyond_the_scale_and_reasoning_summaries_are_refused() -> None:
    capabilities = ab.create_backend("mock", thinking="split").capabilities
    with pytest.raises(ab.InvalidRequestError, match="reasoning_effort"):
        convert.sampling_params(GenerateConfig(reasoning_effort="xhigh"), capabilities, "mock")
    with pytest.raises(ab.InvalidRequestError, match=r"GenerateConfig\.reasoning_summary="):
        convert.sampling_params(GenerateConfig(reasoning_summary="auto"), capabilities, "mock")
    assert convert.sampling_params(GenerateConfig(reasoning_summary="none"), capabilities, "mock")
    # The history setting is inspect's own: nothing to send, never refused.
    assert convert.sampling_params(GenerateConfig(reasoning_history="none"), capabilities, "mock")


@solver
def _three_turns() -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        for turn in ("again", "once more"):
            state = await generate(state)
            state.messages.append(ChatMessageUser(content=turn))
        return await generate(state)

    return solve


@pytest.mark.parametrize(("history", "kept"), [("all", 2), ("auto", 2), ("last", 1), ("none", 0)])
def test_reasoning_history_as_inspect_resolves_it(
    tmp_path: Path, make_model: Any, history: str, kept: int
) -> None:
    log = _run(
        tmp_path,
        make_model(thinking="split"),
        ["q"],
        plan=_three_turns(),
        reasoning_history=history,
        max_tokens=4000,
    )
    assert log.samples is not None
    # The last request as the provider sent it (its ModelCall): the thoughts inspect kept are <think> text
    # in their assistant turns, as inspect's own OpenAI-compatible and vLLM providers send them.
    sample = resolve_sample_attachments(log.samples[0], "full")
    calls = [e.call for e in sample.events if isinstance(e, ModelEvent) and e.call is not None]
    assert len(calls) == 3
    turns = [m["content"] for m in calls[-1].request["prompt"] if m["role"] == "assistant"]
    assert len(turns) == 2
    assert [t.startswith("<think>") for t in turns] == [kept == 2, kept >= 1]


def test_reasoning_in_history_becomes_think_text() -> None:
    message = ChatMessageAssistant(
        content=[ContentReasoning(reasoning="two and two"), ContentText(text="four")]
    )
    converted = convert.messages_of([ChatMessageUser(content="q"), message])
    assert converted[1] == {"role": "assistant", "content": "<think>\ntwo and two\n</think>\nfour"}
