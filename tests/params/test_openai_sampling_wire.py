"""The optional sampling parameters on the OpenAI wire: vLLM servers and plain ones."""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.openai import OpenAIBackend
from asyncbackends.adapters.openai._wire import capabilities, completion_payload

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
ALL = {
    "repetition_penalty": 1.1,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "min_p": 0.2,
    "min_tokens": 2,
    "json_schema": SCHEMA,
}


def payload(vllm: bool, prompt: Any = "hi", **params: Any) -> dict[str, Any]:
    return completion_payload("m", ab.GenerationRequest(prompt, ab.SamplingParams(**params)), vllm=vllm)


def test_vllm_server_gets_its_extra_fields_and_structured_outputs() -> None:
    body = payload(True, **ALL)
    assert {k: body[k] for k in ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p")} == {
        "repetition_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "min_p": 0.2,
    }
    assert body["min_tokens"] == 2
    assert body["structured_outputs"] == {"json": SCHEMA}
    assert "response_format" not in body
    assert payload(True, regex="a+")["structured_outputs"] == {"regex": "a+"}
    chat = payload(True, [{"role": "user", "content": "x"}], regex="a+")
    assert chat["structured_outputs"] == {"regex": "a+"} and "messages" in chat


def test_plain_server_gets_openai_fields_only() -> None:
    body = payload(False, presence_penalty=0.5, frequency_penalty=0.1, json_schema=SCHEMA)
    assert body["presence_penalty"] == 0.5 and body["frequency_penalty"] == 0.1
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": SCHEMA, "strict": True},
    }
    assert not {"repetition_penalty", "min_p", "min_tokens", "structured_outputs"} & set(body)


def test_unset_parameters_send_nothing() -> None:
    assert payload(True) == {
        "model": "m",
        "max_tokens": 256,
        "prompt": "hi",
        "temperature": 0.0,
        "return_token_ids": True,
    }


def test_capabilities_by_server_kind() -> None:
    honoured = {
        kind: {n for n in ab._types.OPTIONAL_SAMPLING_PARAMS if getattr(capabilities(kind, None), n)}
        for kind in ("vllm", "generic")
    }
    # reasoning_effort is OpenAI's own chat field; thinking_budget is vLLM's thinking_token_budget.
    assert honoured["vllm"] == set(ab._types.OPTIONAL_SAMPLING_PARAMS)
    assert honoured["generic"] == {"presence_penalty", "frequency_penalty", "json_schema", "reasoning_effort"}
    assert capabilities("generic", None).reasoning and capabilities("vllm", None).reasoning


@pytest.mark.parametrize("name", ["repetition_penalty", "min_p", "min_tokens", "regex", "thinking_budget"])
def test_plain_server_refuses_vllm_extras_before_sending(name: str) -> None:
    # The port is closed: a request that got as far as the wire would fail as unavailable, not rejected.
    backend = OpenAIBackend(base_url="http://127.0.0.1:9/v1", model="m", server="generic")
    value = {"repetition_penalty": 1.2, "min_p": 0.1, "min_tokens": 1, "regex": "a", "thinking_budget": 8}[
        name
    ]
    request = ab.GenerationRequest("hi", ab.SamplingParams(**{name: value}))
    try:
        with pytest.raises(ab.RequestRejectedError, match=f"{name}.*server='vllm'"):
            ab.get_loop_manager().run(backend.generate(request))
    finally:
        backend.close()
