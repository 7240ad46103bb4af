"""Tool calling through a real `vllm serve` (``--enable-auto-tool-choice --tool-call-parser pythonic``).

Each answer is compared with the in-process vllm adapter's on the same weights (reference.py), whose tool
path is checked token for token against vLLM's offline ``LLM.chat`` in tests/vllm/test_chat_vllm.py; the
request is built as OpenAI defines it (tests/openai/test_wire_chat.py checks that against the OpenAI SDK).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import jsonschema
import pytest

import asyncbackends as ab
from asyncbackends.adapters.openai import OpenAIBackend

from .cases import CITY, TOOLS
from .conftest import API_KEY, Served

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]  # may start the server


def _answer(served: Served, backend: OpenAIBackend, case: str) -> tuple[ab.Completion, dict[str, Any]]:
    """The served answer to ``TOOLS[case]`` and the in-process one, whose tokens it must equal."""
    (result,) = ab.run_batch(backend, [TOOLS[case]])
    completion, expected = result.completions[0], served.reference["tools"][case]
    assert list(completion.token_ids) == expected["token_ids"]
    return completion, expected


def _calls(completion: ab.Completion) -> list[tuple[str, object]]:
    return [(call.name, json.loads(call.arguments)) for call in completion.tool_calls]


def test_a_named_tool_choice_returns_a_call_valid_for_the_schema(
    served: Served, backend: OpenAIBackend
) -> None:
    completion, expected = _answer(served, backend, "named")
    # Both engines constrain the output to the tool's parameters schema (equal tokens, checked above).
    (call,) = completion.tool_calls
    assert call.name == "city" and call.id and completion.text == ""
    jsonschema.validate(json.loads(call.arguments), CITY.parameters)
    assert call.arguments == expected["tool_calls"][0]["arguments"]
    # vLLM says "stop" for a named call, as OpenAI does; a completion holding calls reads "tool_calls".
    assert completion.finish_reason == expected["finish_reason"] == "tool_calls"


def test_required_is_constrained_to_a_list_of_calls(served: Served, backend: OpenAIBackend) -> None:
    # vLLM's schema for "required" is a list of calls with no maxItems (OpenAI's parallel_tool_calls, which
    # would bound it, is not a request field here): the random weights keep adding calls until max_tokens.
    completion, expected = _answer(served, backend, "required")
    assert completion.finish_reason == expected["finish_reason"] == "length"
    # Cut inside the list, nothing parses as calls; the server drops the unparsed text (the in-process
    # adapter returns it), so the constraint is read in the reference's text of the same tokens.
    assert completion.tool_calls == () and completion.text == ""
    text = expected["text"]
    assert text.startswith("[")
    first, _ = json.JSONDecoder().raw_decode(text, 1)
    assert first["name"] == "city"
    jsonschema.validate(first["parameters"], CITY.parameters)


def test_auto_tool_choice_is_read_by_the_servers_parser(served: Served, backend: OpenAIBackend) -> None:
    # The regex makes the model spell a pythonic call (the random weights never write one on their own); the
    # server's parser must read it back, as the in-process adapter's does.
    completion, expected = _answer(served, backend, "auto_forced")
    assert _calls(completion) == [("city", {"name": "Paris"})]
    assert completion.finish_reason == expected["finish_reason"] == "tool_calls"
    assert completion.text == expected["text"] == ""


def test_the_second_turn_is_accepted_and_answered_as_in_process(
    served: Served, backend: OpenAIBackend
) -> None:
    # The assistant's tool_calls and the role "tool" message go as OpenAI defines them; "auto" lets the
    # parser read the answer, which from random weights is text.
    completion, expected = _answer(served, backend, "second_turn")
    assert completion.text == expected["text"] and completion.tool_calls == ()
    assert completion.finish_reason == expected["finish_reason"]


@pytest.mark.parametrize("case", ["named", "auto_forced", "second_turn"])
def test_the_exchange_is_openais_wire_format(served: Served, backend: OpenAIBackend, case: str) -> None:
    # The adapter's own body, valid for the OpenAI SDK's request type; the server's answer, valid for its
    # response type, read by the adapter as the SDK reads it.
    from openai.types.chat import ChatCompletion
    from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
    from pydantic import TypeAdapter

    from asyncbackends.adapters.openai._wire import completion_payload, parse_completions

    payload = completion_payload(served.model, TOOLS[case], vllm=True)
    TypeAdapter(CompletionCreateParamsNonStreaming).validate_python(payload)
    request = urllib.request.Request(
        served.base_url + "/chat/completions",
        json.dumps(payload).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        raw = json.load(resp)
    message = ChatCompletion.model_validate(raw).choices[0].message
    sdk_calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]
    (completion,), *_ = parse_completions(raw, chat=True, logprobs=False)
    assert _calls(completion) == sdk_calls and completion.text == (message.content or "")
    assert bool(sdk_calls) == (case != "second_turn")
