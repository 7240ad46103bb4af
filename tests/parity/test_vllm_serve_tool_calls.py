"""Greedy tool calls of the in-process ``vllm`` adapter equal a real ``vllm serve``'s for the same body.

The server (the tiny VLM, Hermes-style template, ``--enable-auto-tool-choice --tool-call-parser hermes``)
answers each body with ``return_token_ids``; the same messages, tools and tool choice go to the adapter
(``tool_parser="hermes"``). Compared: the generated token ids, and the tool calls (names and arguments) and
text the server's message holds. Forced choices are the point: vLLM 0.32's server constrains a named or
``"required"`` choice by an xgrammar structural tag around ``<tool_call>`` JSON and reads the call back with
the Hermes parser, where a JSON schema of the arguments alone gives other tokens and no ``<tool_call>``.
Finish reasons are not compared: the library reports ``"tool_calls"`` whenever a completion holds a call,
the server ``"stop"`` for a named choice (OpenAI's convention).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import asyncbackends as ab

from ..vllm_serve import Pair
from .test_vllm_serve_prompts import ADD, BARE, NESTED, STRICT, UNDESCRIBED, USER, _named

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_TOKENS = 64  # room for the whole calls `_writes` makes; a longer one is cut on both sides alike

BOOK = {"role": "user", "content": "Book Paris for Ada"}
CALLED = [
    USER,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"x": 1, "y": 2}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "3"},
]


def _writes(*calls: str) -> dict[str, Any]:
    """vLLM's ``structured_outputs`` body field making the model write exactly these Hermes calls."""
    text = "".join(f"<tool_call>{call}</tool_call>" for call in calls)
    return {"regex": re.sub(r"([{}\[\]().*+?^$|\\])", r"\\\1", text)}


ADD_CALL = '{"name": "add", "arguments": {"x": 1, "y": 2}}'
BOOK_CALL = '{"name": "book", "arguments": {"city": "Rome", "who": [{"name": "Zoë"}]}}'

# name -> a chat completions body's messages, tools and tool_choice (and a constraint: see `_writes`)
CASES: dict[str, dict[str, Any]] = {
    "named": {"messages": [USER], "tools": [ADD], "tool_choice": _named("add")},
    "named_second_of_two": {"messages": [USER], "tools": [BARE, ADD], "tool_choice": _named("add")},
    "named_no_arguments": {"messages": [USER], "tools": [BARE, ADD], "tool_choice": _named("now")},
    "named_nested": {"messages": [BOOK], "tools": [NESTED], "tool_choice": _named("book")},
    "named_strict": {"messages": [USER], "tools": [STRICT], "tool_choice": _named("add_strict")},
    "named_after_a_call": {"messages": CALLED, "tools": [ADD], "tool_choice": _named("add")},
    "required": {"messages": [USER], "tools": [ADD, UNDESCRIBED], "tool_choice": "required"},
    "required_one": {"messages": [USER], "tools": [ADD], "tool_choice": "required"},
    "required_nested": {"messages": [BOOK], "tools": [NESTED, BARE], "tool_choice": "required"},
    "required_strict": {"messages": [USER], "tools": [STRICT, BARE], "tool_choice": "required"},
    "auto": {"messages": [USER], "tools": [ADD], "tool_choice": "auto"},
    "auto_many": {"messages": [BOOK], "tools": [ADD, BARE, NESTED], "tool_choice": "auto"},
    "auto_strict": {"messages": [USER], "tools": [STRICT], "tool_choice": "auto"},
    "auto_after_a_call": {"messages": CALLED, "tools": [ADD], "tool_choice": "auto"},
    # A random model seldom closes a call it was not made to write: these make it write whole ones, which
    # the server's parser reads (names, arguments, the text around them).
    "auto_writes_a_call": {
        "messages": [USER],
        "tools": [ADD],
        "tool_choice": "auto",
        "structured_outputs": _writes(ADD_CALL),
    },
    "auto_writes_two_calls": {
        "messages": [BOOK],
        "tools": [ADD, NESTED],
        "tool_choice": "auto",
        "structured_outputs": _writes(ADD_CALL, BOOK_CALL),
    },
    "auto_writes_an_unknown_tool": {
        "messages": [USER],
        "tools": [ADD],
        "tool_choice": "auto",
        "structured_outputs": _writes('{"name": "mul", "arguments": {"x": 2}}'),
    },
    "auto_writes_broken_json": {
        "messages": [USER],
        "tools": [ADD],
        "tool_choice": "auto",
        "structured_outputs": {"regex": '<tool_call>\\{"name": "add", oops</tool_call>'},
    },
}


def _request(body: dict[str, Any]) -> ab.GenerationRequest:
    choice = body["tool_choice"]
    if isinstance(choice, dict):
        choice = choice["function"]["name"]
    regex = body.get("structured_outputs", {}).get("regex")
    params = ab.SamplingParams(max_tokens=MAX_TOKENS, temperature=0, regex=regex)
    return ab.GenerationRequest(body["messages"], params, tools=body["tools"], tool_choice=choice)


def _calls(calls: Any) -> list[tuple[str, Any]]:
    """(name, arguments as JSON values) of each call: the arguments' spacing is the parser's, not the model's."""
    return [(name, json.loads(arguments)) for name, arguments in calls]


@pytest.mark.parametrize("case", CASES)
def test_greedy_tool_calls_equal_vllm_serves(vlm_pair: Pair, case: str) -> None:
    body = CASES[case]
    served = vlm_pair.chat(**body, max_tokens=MAX_TOKENS)
    (result,) = ab.run_batch(vlm_pair.backend, [_request(body)])
    choice, completion = served["choices"][0], result.completions[0]
    assert list(completion.token_ids) == choice["token_ids"]
    message = choice["message"]
    served_calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()
    ]
    ours = [(call.name, call.arguments) for call in completion.tool_calls]
    assert _calls(ours) == _calls(served_calls)
    assert [arguments for _, arguments in ours] == [arguments for _, arguments in served_calls]
    assert completion.text == (message.get("content") or "")


def test_forced_choices_open_with_a_tool_call_as_the_server_writes_them(vlm_pair: Pair) -> None:
    # The difference this module was written for: the server's forced output opens with the call's tag,
    # which a constraint on the arguments alone never writes.
    for case in ("named", "required"):
        served = vlm_pair.chat(**CASES[case], max_tokens=MAX_TOKENS)
        (result,) = ab.run_batch(vlm_pair.backend, [_request(CASES[case])])
        text = vlm_pair.backend.tokenizer.decode(result.completions[0].token_ids)
        assert text.startswith("<tool_call>"), text
        assert list(result.completions[0].token_ids) == served["choices"][0]["token_ids"]


def test_the_server_writes_whole_calls_so_the_comparison_sees_names_and_arguments(vlm_pair: Pair) -> None:
    # Guards the comparison above from passing on empty lists: a random model may pad a forced call with
    # whitespace until max_tokens (the structural tag allows it), which no parser reads as a call.
    called = {
        case: [c["function"]["name"] for c in message.get("tool_calls") or ()]
        for case in CASES
        if (message := vlm_pair.chat(**CASES[case], max_tokens=MAX_TOKENS)["choices"][0]["message"])
    }
    whole = {case: names for case, names in called.items() if names}
    assert len(whole) >= 3, called
