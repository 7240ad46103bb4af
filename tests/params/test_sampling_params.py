"""The optional sampling parameters: validation when built, capabilities, refusal, cache keys."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._cache import ResponseCache
from asyncbackends._refusals import refuse_unsupported
from asyncbackends._types import OPTIONAL_SAMPLING_PARAMS

VALID: dict[str, Any] = {
    "repetition_penalty": 1.2,
    "presence_penalty": -2,
    "frequency_penalty": 2,
    "min_p": 0.05,
    "min_tokens": 3,
    "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "regex": r"\d+",
}


def test_defaults_are_none_and_capabilities_claim_nothing() -> None:
    params = ab.SamplingParams()
    assert all(getattr(params, name) is None for name in OPTIONAL_SAMPLING_PARAMS)
    assert params.optional_params() == {}
    caps = ab.Capabilities()
    assert not any(getattr(caps, name) for name in OPTIONAL_SAMPLING_PARAMS)
    assert set(OPTIONAL_SAMPLING_PARAMS) <= set(ab.Capabilities.__dataclass_fields__)


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_values_are_kept(name: str) -> None:
    params = ab.SamplingParams(**{name: VALID[name]})
    assert params.optional_params() == {name: VALID[name]}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": math.inf}, "repetition_penalty"),
        ({"repetition_penalty": math.nan}, "repetition_penalty"),
        ({"presence_penalty": 2.01}, "presence_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"presence_penalty": True}, "presence_penalty"),
        ({"frequency_penalty": "0.5"}, "frequency_penalty"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 1.0}, "min_tokens"),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
        ({"json_schema": "{}"}, "json_schema must be a mapping"),
        ({"json_schema": [1]}, "json_schema must be a mapping"),
        ({"json_schema": {"a": {1, 2}}}, "JSON-serialisable"),
        ({"json_schema": {"a": math.nan}}, "JSON-serialisable"),
        ({"regex": "(unclosed"}, "regex does not compile"),
        ({"regex": ""}, "regex must be a non-empty str"),
        ({"regex": 3}, "regex must be a non-empty str"),
        ({"regex": "a", "json_schema": {}}, "mutually exclusive"),
    ],
)
def test_invalid_values_are_refused_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=message):
        ab.SamplingParams(**kwargs)


def test_bounds_are_inclusive_where_vllm_s_are() -> None:
    params = ab.SamplingParams(presence_penalty=2, frequency_penalty=-2, min_p=1, min_tokens=0, max_tokens=0)
    assert (params.presence_penalty, params.frequency_penalty, params.min_p) == (2.0, -2.0, 1.0)
    assert isinstance(params.presence_penalty, float)  # 2 and 2.0 are one request (equality, cache keys)
    assert ab.SamplingParams(min_p=0) == ab.SamplingParams(min_p=0.0)


def test_json_schema_is_a_deep_copy_and_params_stay_hashable() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}}}
    params = ab.SamplingParams(json_schema=schema)
    schema["properties"]["a"]["type"] = "integer"
    assert params.json_schema == {"type": "object", "properties": {"a": {"type": "string"}}}
    hash(params)  # the schema takes no part in hash(), so frozen params stay usable as keys
    assert params == ab.SamplingParams(
        json_schema={"type": "object", "properties": {"a": {"type": "string"}}}
    )
    assert params != ab.SamplingParams(json_schema={"type": "object"})


def test_unsupported_lists_what_is_set_and_not_claimed() -> None:
    params = ab.SamplingParams(min_p=0.1, regex="a+", repetition_penalty=1.1)
    assert ab.Capabilities().unsupported(params) == ("repetition_penalty", "min_p", "regex")
    assert ab.Capabilities(min_p=True, regex=True).unsupported(params) == ("repetition_penalty",)
    assert ab.Capabilities(**dict.fromkeys(OPTIONAL_SAMPLING_PARAMS, True)).unsupported(params) == ()


def test_refusal_names_every_parameter_and_the_reason() -> None:
    params = ab.SamplingParams(min_p=0.1, min_tokens=2)
    with pytest.raises(ab.RequestRejectedError, match=r"min_p, min_tokens.*min_p: no logits") as info:
        refuse_unsupported(
            params, ab.Capabilities(), backend="x", request_id="r1", reasons={"min_p": "no logits"}
        )
    assert info.value.request_id == "r1" and info.value.backend == "x" and not info.value.retryable
    refuse_unsupported(ab.SamplingParams(), ab.Capabilities(), backend="x", request_id=None)


@pytest.mark.parametrize("name", sorted(VALID))
def test_cache_key_includes_each_parameter(tmp_path: Path, name: str) -> None:
    cache = ResponseCache(tmp_path / "c.sqlite")
    backend = ab.create_backend("mock")
    plain = ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=8))
    with_it = ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=8, **{name: VALID[name]}))
    same = ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=8, **{name: VALID[name]}))
    assert cache.key(backend, plain) != cache.key(backend, with_it)
    assert cache.key(backend, with_it) == cache.key(backend, same)
    cache.close()


def test_cache_key_tells_schemas_apart(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path / "c.sqlite")
    backend = ab.create_backend("mock")
    one = ab.GenerationRequest("hi", ab.SamplingParams(json_schema={"type": "object", "required": ["a"]}))
    two = ab.GenerationRequest("hi", ab.SamplingParams(json_schema={"type": "object", "required": ["b"]}))
    reordered = ab.GenerationRequest(
        "hi", ab.SamplingParams(json_schema={"required": ["a"], "type": "object"})
    )
    assert cache.key(backend, one) != cache.key(backend, two)
    assert cache.key(backend, one) == cache.key(backend, reordered)
    cache.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reasoning_effort", "extreme"),
        ("reasoning_effort", 3),
        ("thinking_budget", -1),
        ("thinking_budget", 1.5),
    ],
)
def test_reasoning_params_checked_at_construction(field: str, value: object) -> None:
    with pytest.raises(ab.InvalidRequestError, match=field):
        ab.SamplingParams(**{field: value})


def test_reasoning_params_are_optional_and_refused_unless_claimed() -> None:
    params = ab.SamplingParams(reasoning_effort="high", thinking_budget=0)
    assert params.optional_params() == {"reasoning_effort": "high", "thinking_budget": 0}
    assert ab.Capabilities().unsupported(params) == ("reasoning_effort", "thinking_budget")
    assert ab.Capabilities(thinking_budget=True).unsupported(params) == ("reasoning_effort",)


def test_completion_cut_off_while_thinking_has_no_answer() -> None:
    done = ab.Completion("", reasoning="half a thought", reasoning_tokens=3, reasoning_truncated=True)
    assert (done.text, done.reasoning, done.reasoning_tokens) == ("", "half a thought", 3)
    with pytest.raises(ab.InvalidRequestError, match="no answer"):
        ab.Completion("half a thought", reasoning_truncated=True)
    with pytest.raises(ab.InvalidRequestError, match="reasoning_tokens"):
        ab.Completion("x", reasoning_tokens=-1)
