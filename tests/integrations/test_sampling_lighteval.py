"""lighteval's GenerationParameters and task grammars for the optional sampling parameters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lighteval")

from huggingface_hub import TextGenerationInputGrammarType
from lighteval.models.model_input import GenerationParameters
from lighteval.tasks.requests import Doc

import asyncbackends as ab
from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _model(tmp_path: Path, **generation: Any) -> AsyncBackendsModel:
    config = AsyncBackendsModelConfig(
        model_name="mock-echo",
        cache_dir=str(tmp_path / "cache"),
        progress=False,
        generation_parameters=GenerationParameters(**generation),
    )
    return AsyncBackendsModel(config)


def _doc(**fields: Any) -> Doc:
    return Doc(query="q", choices=["x"], gold_index=0, task_name="t|0", **fields)


def test_generation_parameters_pass_through(tmp_path: Path) -> None:
    model = _model(
        tmp_path,
        temperature=0.5,
        repetition_penalty=1.2,
        presence_penalty=0.1,
        frequency_penalty=0.3,
        min_p=0.05,
        min_new_tokens=2,
        response_format=json.dumps({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}),
    )
    try:
        params = model.sampling_params(_doc())
        assert params.optional_params() == {
            "repetition_penalty": 1.2,
            "presence_penalty": 0.1,
            "frequency_penalty": 0.3,
            "min_p": 0.05,
            "min_tokens": 2,
            "json_schema": SCHEMA,
        }
    finally:
        model.cleanup()


@pytest.mark.parametrize(
    ("grammar", "expected"),
    [
        (TextGenerationInputGrammarType(type="regex", value="[ab]+"), {"regex": "[ab]+"}),
        (TextGenerationInputGrammarType(type="json", value=SCHEMA), {"json_schema": SCHEMA}),
        (TextGenerationInputGrammarType(type="json", value=json.dumps(SCHEMA)), {"json_schema": SCHEMA}),
    ],
)
def test_task_grammar_passes_through(tmp_path: Path, grammar: Any, expected: dict[str, Any]) -> None:
    model = _model(tmp_path)
    try:
        assert model.sampling_params(_doc(generation_grammar=grammar)).optional_params() == expected
    finally:
        model.cleanup()


@pytest.mark.parametrize(
    "generation",
    [{"length_penalty": 0.5}, {"early_stopping": True}, {"truncate_prompt": True}],
)
def test_fields_without_equivalent_fail_when_the_model_is_built(tmp_path: Path, generation: Any) -> None:
    (name,) = generation
    with pytest.raises(ab.InvalidRequestError, match=f"{name}.*ignore_generation_parameters"):
        _model(tmp_path, **generation)


def test_opt_out_and_memory_only_fields(tmp_path: Path) -> None:
    config = AsyncBackendsModelConfig(
        model_name="mock-echo",
        cache_dir=str(tmp_path / "cache"),
        progress=False,
        generation_parameters=GenerationParameters(
            length_penalty=0.5, num_blocks=8, cache_implementation="static", early_stopping=False
        ),
        ignore_generation_parameters=["length_penalty"],
    )
    model = AsyncBackendsModel(config)
    try:
        assert model.sampling_params(_doc()).optional_params() == {}
    finally:
        model.cleanup()


def test_response_format_must_be_a_json_schema(tmp_path: Path) -> None:
    with pytest.raises(ab.InvalidRequestError, match="response_format"):
        _model(tmp_path, response_format='{"type": "json_object"}')


def test_refused_parameter_fails_generation(tmp_path: Path) -> None:
    model = _model(tmp_path, min_p=0.1)
    try:
        with pytest.raises(ab.RequestRejectedError, match="min_p"):
            model.greedy_until([_doc(generation_size=4)])
    finally:
        model.cleanup()
