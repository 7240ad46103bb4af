"""The sampling-parameter table: complete, agreeing with `SamplingParams`, and what the wire builders send.

Each builder is asked for a request setting one parameter and compared with the table's name for its wire;
a field added to `SamplingParams` without a row fails here first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._sampling_table import OPTIONAL_SPECS, SAMPLING_TABLE, SPECS, SamplingParamSpec
from asyncbackends._types import OPTIONAL_SAMPLING_PARAMS, GenerationRequest
from asyncbackends.adapters.openai import _wire as _openai_wire
from asyncbackends.adapters.tgi import _wire as _tgi_wire
from asyncbackends.testing.openapi import load_spec

# A value of each core parameter unlike its default; sampling (temperature 0.25) around it, so n > 1 and the
# warpers are sent. The optional parameters use the table's examples.
_CORE = {"max_tokens": 7, "temperature": 0.5, "top_p": 0.5, "top_k": 3, "stop": ("x",), "n": 2, "seed": 11}
_BASE: dict[str, Any] = {"temperature": 0.25}
# Keys a builder sends for a parameter it handles in its own code (structured output), not a plain rename.
_SPECIAL_KEYS = {"structured_outputs", "response_format", "grammar"}


def _value(spec: SamplingParamSpec) -> Any:
    return spec.example if spec.optional else _CORE.get(spec.name, True)


def _wire(value: Any) -> Any:
    """A value as it goes on the wire: a sequence as a list."""
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


def _request(chat: bool, **params: Any) -> GenerationRequest:
    prompt: Any = [{"role": "user", "content": "hi"}] if chat else "hi"
    return GenerationRequest(prompt, params=ab.SamplingParams(**params), request_id="r")


def test_every_sampling_params_field_has_a_row_in_declaration_order() -> None:
    fields = [f.name for f in dataclasses.fields(ab.SamplingParams)]
    assert [spec.name for spec in SAMPLING_TABLE] == fields
    assert list(SPECS) == fields


def test_optional_rows_default_to_none_and_have_a_capability_flag_of_their_name() -> None:
    defaults = ab.SamplingParams()
    flags = {f.name for f in dataclasses.fields(ab.Capabilities)}
    assert tuple(spec.name for spec in OPTIONAL_SPECS) == OPTIONAL_SAMPLING_PARAMS
    for spec in SAMPLING_TABLE:
        assert spec.capability is None or spec.capability in flags, spec.name
        if spec.optional:
            assert getattr(defaults, spec.name) is None
            assert spec.capability == spec.name
            ab.SamplingParams(**{spec.name: spec.example})  # the contract suite's value is valid


@pytest.mark.parametrize("spec", [s for s in SAMPLING_TABLE if s.bounds], ids=lambda s: s.name)
def test_bounds_are_what_sampling_params_accepts(spec: SamplingParamSpec) -> None:
    assert spec.bounds is not None
    low, high, closed = spec.bounds
    below = low if not closed else low - 0.5
    with pytest.raises(ab.InvalidRequestError, match=spec.name):
        ab.SamplingParams(**{spec.name: below})
    if closed:
        assert getattr(ab.SamplingParams(**{spec.name: low}), spec.name) == low
    else:
        ab.SamplingParams(**{spec.name: low + 1e-6})
    if math.isfinite(high):
        assert getattr(ab.SamplingParams(**{spec.name: high}), spec.name) == high
        with pytest.raises(ab.InvalidRequestError, match=spec.name):
            ab.SamplingParams(**{spec.name: high + 0.5})
    else:
        with pytest.raises(ab.InvalidRequestError, match=spec.name):
            ab.SamplingParams(**{spec.name: math.inf})


# What the core parameters the table names no plain field for become on each wire, written out from the wire
# specs: OpenAI's chat API takes logprobs as the boolean `logprobs`; TGI's /generate has no `n` (samples are
# separate requests), takes `seed` per request (the builder's own argument, one per sample) and always
# returns token logprobs under `details`; TGI's chat route has no `top_k`, and takes `logprobs` as a boolean.
_UNNAMED_CORE: dict[tuple[str, str], dict[str, Any]] = {
    ("openai", "logprobs"): {"logprobs": True},
    ("tgi", "n"): {},
    ("tgi", "seed"): {},
    ("tgi", "logprobs"): {},
    ("tgi_chat", "top_k"): {},
    ("tgi_chat", "n"): {},
    ("tgi_chat", "seed"): {},
    ("tgi_chat", "logprobs"): {"logprobs": True},
}


def _sends_as_named(
    build: Callable[..., dict[str, Any]], spec: SamplingParamSpec, key: str | None, wire: str
) -> None:
    """``build(**params)`` sends ``spec``'s value under ``key`` and changes nothing else (``None``: no field)."""
    value = _value(spec)
    base, body = build(**_BASE), build(**{**_BASE, spec.name: value})
    added = {k for k in body if k not in base or body[k] != base[k]}
    if key is not None:
        assert body[key] == _wire(value)
        assert added == {key}
    elif spec.optional:
        assert added <= _SPECIAL_KEYS, f"{spec.name} sent as {added} though the table names no field for it"
    else:
        assert {k: body[k] for k in added} == _UNNAMED_CORE[wire, spec.name]


@pytest.mark.parametrize("vllm", [True, False], ids=["vllm-server", "other-server"])
@pytest.mark.parametrize("spec", SAMPLING_TABLE, ids=lambda s: s.name)
def test_openai_body_sends_what_the_table_names(spec: SamplingParamSpec, vllm: bool) -> None:
    def build(**params: Any) -> dict[str, Any]:
        return _openai_wire.completion_payload("m", _request(True, **params), vllm=vllm)

    _sends_as_named(build, spec, spec.openai or (spec.openai_vllm if vllm else None), "openai")


def test_openai_capabilities_are_what_the_servers_take() -> None:
    # Written out: OpenAI's chat API takes presence/frequency penalties, a JSON Schema response_format and
    # reasoning_effort; vLLM's server adds repetition_penalty, min_p, min_tokens, a regex and a thinking
    # budget (its SamplingParams' extra fields). Another server is asked for none of vLLM's extensions.
    openai = {"presence_penalty", "frequency_penalty", "json_schema", "reasoning_effort"}
    vllm_extras = {"repetition_penalty", "min_p", "min_tokens", "regex", "thinking_budget"}
    for server, honoured in (("vllm", openai | vllm_extras), ("generic", openai)):
        caps = _openai_wire.capabilities(server, None)
        assert {spec.name for spec in OPTIONAL_SPECS if getattr(caps, spec.name)} == honoured, server


@pytest.mark.parametrize("spec", SAMPLING_TABLE, ids=lambda s: s.name)
def test_tgi_bodies_send_what_the_table_names(spec: SamplingParamSpec) -> None:
    def generate(**params: Any) -> dict[str, Any]:
        parameters: dict[str, Any] = _tgi_wire.generate_payload(_request(False, **params), None)["parameters"]
        return parameters

    def chat(**params: Any) -> dict[str, Any]:
        return _tgi_wire.chat_payload(_request(True, **params), None)

    _sends_as_named(generate, spec, spec.tgi, "tgi")
    _sends_as_named(chat, spec, spec.tgi_chat, "tgi_chat")


def test_tgi_claims_and_refusals_are_what_tgis_spec_allows() -> None:
    # Written out from TGI's published OpenAPI spec: /generate's GenerateParameters has repetition_penalty,
    # frequency_penalty and a grammar (JSON Schema or regex); its ChatRequest has no repetition_penalty; neither
    # has min_p or a minimum length; presence_penalty exists on the chat route only, where TGI turns it into a
    # repetition penalty (refused: not what it asks).
    assert set(_tgi_wire.HONOURED) == {"repetition_penalty", "frequency_penalty", "json_schema", "regex"}
    assert set(_tgi_wire.NOT_ON_CHAT) == {"repetition_penalty"}
    assert set(_tgi_wire.UNSUPPORTED_REASONS) == {"presence_penalty", "min_p", "min_tokens"}
    schemas = load_spec()["components"]["schemas"]
    generate, chat = schemas["GenerateParameters"]["properties"], schemas["ChatRequest"]["properties"]
    assert {"repetition_penalty", "frequency_penalty", "grammar"} <= set(generate)
    assert "repetition_penalty" not in chat and "frequency_penalty" in chat
    for refused in ("min_p", "min_tokens", "min_new_tokens", "presence_penalty"):
        assert refused not in generate


def test_mock_refuses_exactly_the_parameters_that_need_logits() -> None:
    caps = ab.create_backend("mock").capabilities
    for spec in OPTIONAL_SPECS:
        if spec.needs_logits:
            assert not getattr(caps, spec.name), spec.name


def test_tgi_names_are_fields_of_tgis_published_spec() -> None:
    schemas = load_spec()["components"]["schemas"]
    generate, chat = schemas["GenerateParameters"]["properties"], schemas["ChatRequest"]["properties"]
    for spec in SAMPLING_TABLE:
        assert spec.tgi is None or spec.tgi in generate, spec.name
        assert spec.tgi_chat is None or spec.tgi_chat in chat, spec.name


def test_openai_names_are_fields_of_the_openai_sdks_chat_request() -> None:
    completion_create_params = pytest.importorskip("openai.types.chat.completion_create_params")
    fields = completion_create_params.CompletionCreateParamsBase.__annotations__
    # top_k is vLLM's and SGLang's extension, sent to every server as it is (OpenAI itself refuses it).
    extensions = {"top_k"}
    for spec in SAMPLING_TABLE:
        assert spec.openai is None or spec.openai in fields or spec.openai in extensions, spec.name
        assert spec.openai_vllm is None or spec.openai_vllm not in fields, (
            f"{spec.name} is OpenAI's own field"
        )
