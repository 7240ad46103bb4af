"""The optional sampling parameters through the openai adapter on the package's real `vllm serve`.

Structured output must be valid (a regex matched in full, JSON valid against its schema); vLLM's extra
fields (penalties, ``min_p``, ``min_tokens``) must reach the engine: ``min_tokens`` equal to ``max_tokens``
makes every completion run to the limit, and a strong repetition penalty changes greedy tokens.
"""

from __future__ import annotations

import json
import re

import pytest

import asyncbackends as ab
from asyncbackends._protocol import Secret
from asyncbackends.adapters.openai import OpenAIBackend

from .conftest import API_KEY

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
PROMPTS = ["The quick brown fox", "Answer yes or no:"]


def test_structured_outputs_are_valid(backend: OpenAIBackend) -> None:
    import jsonschema

    assert backend.server == "vllm"
    regex = r"(yes|no) [0-9]{2}"
    chat = [{"role": "user", "content": "yes or no?"}]
    requests = [
        ab.GenerationRequest(p, ab.SamplingParams(max_tokens=48, regex=regex)) for p in [*PROMPTS, chat]
    ]
    requests += [
        ab.GenerationRequest(p, ab.SamplingParams(max_tokens=48, json_schema=SCHEMA))
        for p in [*PROMPTS, chat]
    ]
    results = ab.run_batch(backend, requests)
    for result in results[:3]:
        assert re.fullmatch(regex, result.text), result.text
    for result in results[3:]:
        jsonschema.validate(json.loads(result.text), SCHEMA)


def test_vllm_extra_fields_reach_the_engine(backend: OpenAIBackend) -> None:
    plain, penalised, at_least = ab.run_batch(
        backend,
        [
            ab.GenerationRequest(PROMPTS[0], ab.SamplingParams(max_tokens=12)),
            ab.GenerationRequest(
                PROMPTS[0],
                ab.SamplingParams(
                    max_tokens=12, repetition_penalty=2.0, presence_penalty=1.5, frequency_penalty=1.5
                ),
            ),
            ab.GenerationRequest(PROMPTS[0], ab.SamplingParams(max_tokens=12, min_tokens=12, min_p=0.1)),
        ],
    )
    assert penalised.completions[0].token_ids != plain.completions[0].token_ids
    assert len(at_least.completions[0].token_ids) == 12
    assert at_least.completions[0].finish_reason == "length"


def test_same_server_as_generic_refuses_vllm_extras(backend: OpenAIBackend) -> None:
    generic = OpenAIBackend(
        base_url=backend.base_url, model=backend.model, server="generic", api_key=Secret(API_KEY)
    )
    try:
        request = ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=4, min_p=0.1))
        with pytest.raises(ab.RequestRejectedError, match="min_p"):
            ab.run_batch(generic, [request], retry=ab.RetryPolicy(max_attempts=1))
        # json_schema goes as OpenAI's response_format, which vLLM also honours.
        import jsonschema

        schema_request = ab.GenerationRequest(
            PROMPTS[1], ab.SamplingParams(max_tokens=48, json_schema=SCHEMA)
        )
        (result,) = ab.run_batch(generic, [schema_request])
        jsonschema.validate(json.loads(result.text), SCHEMA)
    finally:
        generic.close()
