"""lighteval's custom-model route on the deterministic mock backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lighteval")

from lighteval.models.custom.custom_model import CustomModelConfig
from lighteval.models.model_input import GenerationParameters
from lighteval.models.model_loader import load_model
from lighteval.tasks.requests import Doc

import asyncbackends as ab
from asyncbackends.adapters.mock import MockBackend
from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

from .lighteval_helpers import custom_tasks_only, details, run_pipeline


def _config(tmp_path: Path, **fields: Any) -> AsyncBackendsModelConfig:
    fields.setdefault("progress", False)
    return AsyncBackendsModelConfig(model_name="mock-echo", cache_dir=str(tmp_path / "cache"), **fields)


def _doc(query: str, **fields: Any) -> Doc:
    fields.setdefault("choices", ["x"])
    return Doc(query=query, gold_index=0, task_name="t|0", **fields)


@pytest.fixture
def model(tmp_path: Path) -> Any:
    built = AsyncBackendsModel(
        _config(tmp_path, generation_parameters=GenerationParameters(temperature=0.7, seed=5))
    )
    yield built
    built.cleanup()


def test_sampling_params_from_doc_and_config(model: Any) -> None:
    params = model.sampling_params(_doc("q", generation_size=7, stop_sequences=["\n", ""], num_samples=4))
    assert (params.max_tokens, params.stop, params.n, params.temperature, params.seed) == (
        7,
        ("\n",),
        4,
        0.7,
        5,
    )
    assert model.sampling_params(_doc("q")).max_tokens == 256
    model.config.use_chat_template = True  # the model ends its own turn: task stop sequences are not sent
    assert model.sampling_params(_doc("q", stop_sequences=["\n"])).stop == ()


def test_num_samples_with_greedy_decoding_is_refused(tmp_path: Path) -> None:
    greedy = AsyncBackendsModel(_config(tmp_path))
    try:
        with pytest.raises(ab.InvalidRequestError, match="temperature"):
            greedy.sampling_params(_doc("q", num_samples=3))
    finally:
        greedy.cleanup()


def test_generation_sends_one_request_per_doc_and_keeps_order(model: Any) -> None:
    model.backend.jitter = 0.01
    docs = [_doc(f"prompt number {i}", generation_size=50, num_samples=3, id=str(i)) for i in range(6)]
    responses = model.greedy_until(docs)
    assert sum(model.backend.attempts.values()) == 6  # n samples come back from one request
    for doc, response in zip(docs, responses, strict=True):
        assert len(response.text) == 3
        assert all(
            sorted(text) == sorted(doc.query) for text in response.text
        )  # the mock shuffles its prompt
        assert len(set(response.text)) > 1
        assert response.output_tokens[0] == [ord(c) for c in response.text[0]]
    again = AsyncBackendsModel(model.config).greedy_until(docs)
    assert [r.text for r in again] == [r.text for r in responses]  # seeded: reproducible


def test_loglikelihood_moves_space_and_appends_unconditioned_scores(model: Any) -> None:
    docs = [
        _doc("Answer: ", choices=["Paris", "Rome"], id="0"),
        _doc("Q", choices=["Q", "R"], unconditioned_query="Answer:", id="1"),
    ]
    responses = model.loglikelihood(docs)
    backend = MockBackend()
    score = lambda c, x: ab.run_batch(backend, [ab.LoglikelihoodRequest(c, x)])[0]  # noqa: E731
    # Responses go through lighteval's parquet sample cache: compare with a float tolerance.
    assert responses[0].logprobs == pytest.approx(
        [score("Answer:", " Paris").logprob, score("Answer:", " Rome").logprob]
    )
    assert responses[1].logprobs == pytest.approx(
        [
            score("Q", "Q").logprob,
            score("Q", "R").logprob,
            score("Answer:", "Q").logprob,
            score("Answer:", "R").logprob,
        ]
    )
    assert responses[1].argmax_logits_eq_gold == [True, False]  # the mock is greedy when echoing the context


def test_rolling_loglikelihood_scores_prompt_and_first_choice(model: Any) -> None:
    (response,) = model.loglikelihood_rolling([_doc("hello ", choices=["world"], id="0")])
    expected = ab.run_batch(MockBackend(), [ab.RollingLoglikelihoodRequest("hello world")])[0].logprob
    assert response.logprobs == pytest.approx([expected])


def test_wrapping_a_built_backend_leaves_it_open(tmp_path: Path) -> None:
    backend = ab.create_backend("mock")
    wrapper = AsyncBackendsModel(_config(tmp_path), backend=backend)
    wrapper.cleanup()
    assert not backend.closed
    backend.close()
    owned = AsyncBackendsModel(_config(tmp_path))
    owned.cleanup()
    assert owned.backend.closed


def test_lighteval_loader_builds_it_from_a_definition_file(tmp_path: Path) -> None:
    # The `lighteval custom NAME FILE TASKS` route: a plain CustomModelConfig and a file subclassing ours.
    definition = tmp_path / "my_model.py"
    definition.write_text(
        "from asyncbackends.integrations import lighteval as ab_lighteval\n\n\n"
        "class MyModel(ab_lighteval.AsyncBackendsModel):\n"
        "    config_defaults = {'backend': 'mock', 'backend_options': {'model': 'from-file'}, 'concurrency': 3}\n"
    )
    config = CustomModelConfig(
        model_name="from-file", model_definition_file_path=str(definition), cache_dir=str(tmp_path / "c")
    )
    model = load_model(config)
    try:
        assert model.backend.model == "from-file"
        assert model.config.concurrency == 3
    finally:
        model.cleanup()
    # The config route: our config names this module as the definition file by default.
    default = load_model(_config(tmp_path, backend_options={"model": "default-file"}))
    try:
        assert type(default).__name__ == "AsyncBackendsModel"
        assert default.backend.model == "default-file"
    finally:
        default.cleanup()


def test_pipeline_on_local_tasks_with_mock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    custom_tasks_only(monkeypatch)
    config = _config(tmp_path, generation_parameters=GenerationParameters(temperature=0.9, seed=1))
    pipeline = run_pipeline("ab_mc|0,ab_pass|0", tmp_path / "out", model_config=config)
    results = pipeline.get_results()["results"]
    assert "acc" in results["ab_mc:0"]
    assert "pass@k:k=1&n=4" in results["ab_pass:0"]
    generated = details(pipeline, "ab_pass|0")
    assert len(generated) == 8
    for doc, response in generated:
        assert doc.num_samples == 4
        assert len(response.text) == 4
        assert all(len(text) <= 8 for text in response.text)  # generation_size=8 characters for the mock
    scored = details(pipeline, "ab_mc|0")
    assert len(scored) == 10
    assert all(len(response.logprobs) == len(doc.choices) for doc, response in scored)


class _WithTokenizer(MockBackend):
    """The mock backend holding a tokenizer, as the vllm backend does."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__()
        self.tokenizer = tokenizer


@pytest.mark.parametrize("template", [True, False])
def test_chat_template_is_on_by_default_where_lightevals_own_vllm_model_turns_it_on(
    tmp_path: Path, tiny_model_path: Path, template: bool
) -> None:
    from lighteval.models.utils import uses_chat_template
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(tiny_model_path)
    if not template:
        tokenizer.chat_template = None
    backend: Any = _WithTokenizer(tokenizer)
    model = AsyncBackendsModel(_config(tmp_path), backend=backend)
    try:
        # lighteval's VLLMModel and TransformersModel decide with uses_chat_template on their tokenizer.
        assert model.prompt_manager.use_chat_template is uses_chat_template(tokenizer=tokenizer) is template
        assert AsyncBackendsModel(
            _config(tmp_path, use_chat_template=not template), backend=backend
        )._chat() is (not template)
    finally:
        backend.close()


def test_no_tokenizer_means_plain_prompts_and_says_lightevals_endpoints_differ(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="asyncbackends.integrations.lighteval"):
        model = AsyncBackendsModel(_config(tmp_path))
        explicit = AsyncBackendsModel(_config(tmp_path, use_chat_template=False))
    try:
        assert model.prompt_manager.use_chat_template is False
        assert [r.getMessage() for r in caplog.records if "use_chat_template not set" in r.getMessage()] == [
            "use_chat_template not set and backend 'mock' has no tokenizer: prompts are sent as plain text, "
            "while lighteval's own endpoint models (tgi, inference endpoints, litellm) send chat messages; set "
            "use_chat_template=True for their prompts"
        ]  # once: not for the model that chose
    finally:
        model.cleanup()
        explicit.cleanup()
