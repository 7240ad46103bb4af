"""The mock adapter honours min_tokens, regex and json_schema deterministically and refuses the rest."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters._minimal_match import NoMatchError, minimal_json, minimal_regex_match
from asyncbackends.adapters.mock import MockBackend


def generate(backend: MockBackend, prompt: str = "abc", **params: Any) -> ab.GenerationResult:
    result = ab.get_loop_manager().run(
        backend.generate(ab.GenerationRequest(prompt, ab.SamplingParams(**params)))
    )
    assert isinstance(result, ab.GenerationResult)
    return result


def test_min_tokens_repeats_the_echo_and_delays_stop_strings() -> None:
    backend = MockBackend()
    assert generate(backend, max_tokens=10).text == "abc"
    result = generate(backend, max_tokens=10, min_tokens=7)
    assert result.text == "abcabca" and result.completions[0].finish_reason == "stop"
    assert generate(backend, max_tokens=5, min_tokens=5).completions[0].finish_reason == "length"
    # "b" appears at index 1, before min_tokens: only the one at index 4 may end the completion.
    assert generate(backend, max_tokens=10, min_tokens=4, stop=("b",)).text == "abca"


@pytest.mark.parametrize("pattern", [r"(yes|no)", r"[A-Z][a-z]{2,4} \d+", r"\w+@\w+\.com", r"[^x]{3}"])
def test_regex_output_matches(pattern: str) -> None:
    result = generate(MockBackend(), "whatever", max_tokens=64, temperature=1.0, seed=1, regex=pattern)
    assert re.fullmatch(pattern, result.text)


def test_json_schema_output_is_valid() -> None:
    import jsonschema

    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 2},
            "n": {"type": "integer", "exclusiveMinimum": 4},
        },
        "required": ["name", "tags", "n"],
        "$defs": {"tag": {"enum": ["x", "y"]}},
    }
    result = generate(MockBackend(), max_tokens=128, json_schema=schema)
    jsonschema.validate(json.loads(result.text), schema)


@pytest.mark.parametrize("name", ["repetition_penalty", "presence_penalty", "frequency_penalty", "min_p"])
def test_logit_parameters_refused_before_an_attempt(name: str) -> None:
    backend = MockBackend()
    with pytest.raises(ab.RequestRejectedError, match=name):
        generate(backend, **{name: 0.5})
    assert sum(backend.attempts.values()) == 0


def test_minimal_match_refuses_what_it_cannot_build() -> None:
    with pytest.raises(NoMatchError):
        minimal_regex_match(r"a(?!a)a")
    with pytest.raises(NoMatchError):
        minimal_json({"type": "object", "properties": {"a": {"$ref": "http://x"}}, "required": ["a"]})
    backend = MockBackend()
    with pytest.raises(ab.RequestRejectedError, match="cannot build"):
        generate(backend, regex=r"a(?!a)a")
