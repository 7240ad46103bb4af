"""The prompt the in-process ``vllm`` adapter sends equals the one a real ``vllm serve`` builds for the same body.

Each case is a chat completions body (messages, tools as OpenAI's dicts, tool choice); the server answers it
with ``return_token_ids`` (its ``prompt_token_ids`` and generated ``token_ids``), and the same messages, tools
and choice go to the adapter as a `GenerationRequest`, whose prompt is read where it enters the engine
(``AsyncLLM.add_request``). The tiny VLM's chat template writes each tool with ``tojson``, so the tool's key
order and its null fields are in the tokens; the tiny reasoning model's template opens a thought and drops
earlier ones. Greedy outputs (a few tokens) are compared too, whatever the tool choice.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import asyncbackends as ab

from ..vllm_serve import Pair

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_TOKENS = 4


@functools.cache
def _image(shade: int) -> dict[str, Any]:
    from PIL import Image

    return ab.image_part(Image.new("RGB", (24, 16), (shade, 255 - shade, 90)))


def _tool(name: str, description: str | None = "", parameters: Any = None, **extra: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if description:
        function["description"] = description
    function["parameters"] = parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": {**function, **extra}}


ADD = _tool(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
    },
)
BARE = _tool("now", None)  # no description, no arguments
NESTED = _tool(
    "book",
    'Book "it" for « us ».',
    {
        "type": "object",
        "properties": {
            "city": {"enum": ["Paris", "Rome"]},
            "who": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        },
        "required": ["city"],
    },
)
STRICT = {"type": "function", "function": {**ADD["function"], "name": "add_strict", "strict": True}}
LAX = {"type": "function", "function": {**ADD["function"], "name": "add_lax", "strict": False}}
UNDESCRIBED = _tool("sub", None, ADD["function"]["parameters"])

USER = {"role": "user", "content": "add 1 and 2"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"x": 1, "y": 2}'}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}
CALLED = [
    USER,
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3"},
]


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


# name -> a chat completions body's messages, tools and tool_choice (the fields a prompt depends on).
VLM_CASES: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": "hello there"}]},
    "system": {"messages": [{"role": "system", "content": "Be brief."}, USER]},
    "developer": {"messages": [{"role": "developer", "content": "Answer in French."}, USER]},
    "named_user": {"messages": [{"role": "user", "name": "ada", "content": "hi"}]},
    "turns": {
        "messages": [USER, {"role": "assistant", "content": "3"}, {"role": "user", "content": "and 4 and 5?"}]
    },
    "text_parts": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}
        ]
    },
    "image": {
        "messages": [{"role": "user", "content": [_image(10), {"type": "text", "text": "What is it?"}]}]
    },
    "text_image_text": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare"},
                    _image(200),
                    {"type": "text", "text": "with this."},
                ],
            }
        ]
    },
    "two_images": {
        "messages": [
            {"role": "user", "content": [_image(10), _image(120), {"type": "text", "text": "Same?"}]}
        ]
    },
    "image_then_turn": {
        "messages": [
            {"role": "user", "content": [_image(60), {"type": "text", "text": "Describe."}]},
            {"role": "assistant", "content": "A square."},
            {"role": "user", "content": "Which colour?"},
        ]
    },
    "auto": {"messages": [USER], "tools": [ADD], "tool_choice": "auto"},
    "auto_undescribed": {"messages": [USER], "tools": [UNDESCRIBED], "tool_choice": "auto"},
    "auto_bare": {"messages": [USER], "tools": [BARE], "tool_choice": "auto"},
    "auto_strict": {"messages": [USER], "tools": [STRICT], "tool_choice": "auto"},
    "auto_lax": {"messages": [USER], "tools": [LAX], "tool_choice": "auto"},
    "auto_nested": {
        "messages": [{"role": "user", "content": "Book Paris for Ada"}],
        "tools": [NESTED],
        "tool_choice": "auto",
    },
    "auto_many": {"messages": [USER], "tools": [ADD, BARE, NESTED, STRICT], "tool_choice": "auto"},
    "named": {"messages": [USER], "tools": [ADD], "tool_choice": _named("add")},
    "named_second": {"messages": [USER], "tools": [BARE, ADD], "tool_choice": _named("add")},
    "named_strict": {"messages": [USER], "tools": [STRICT], "tool_choice": _named("add_strict")},
    "named_nested": {
        "messages": [{"role": "user", "content": "Book it"}],
        "tools": [NESTED],
        "tool_choice": _named("book"),
    },
    "required": {"messages": [USER], "tools": [ADD, UNDESCRIBED], "tool_choice": "required"},
    "none": {"messages": [USER], "tools": [ADD], "tool_choice": "none"},
    "none_nested": {"messages": [USER], "tools": [NESTED, BARE], "tool_choice": "none"},
    "called": {"messages": CALLED, "tools": [ADD], "tool_choice": "auto"},
    "called_no_tools": {"messages": CALLED},
    "called_null_content": {
        "messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, CALLED[2]],
        "tools": [ADD],
        "tool_choice": "auto",
    },
    "called_twice": {
        "messages": [
            USER,
            {"role": "assistant", "content": "Let me see.", "tool_calls": [CALL, CALL2]},
            {"role": "tool", "tool_call_id": "call_1", "content": "3"},
            {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
        ],
        "tools": [ADD, BARE],
        "tool_choice": "auto",
    },
    "called_unicode_arguments": {
        "messages": [
            {"role": "user", "content": "Book Berlin for Zoë"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {
                            "name": "book",
                            "arguments": '{"city": "Berlin", "who": [{"name": "Zoë"}]}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": "booked"},
        ],
        "tools": [NESTED],
        "tool_choice": "required",
    },
    "image_and_tools": {
        "messages": [{"role": "user", "content": [_image(30), {"type": "text", "text": "add the sides"}]}],
        "tools": [ADD, BARE],
        "tool_choice": "auto",
    },
    "image_named": {
        "messages": [{"role": "user", "content": [_image(90), {"type": "text", "text": "add"}]}],
        "tools": [ADD],
        "tool_choice": _named("add"),
    },
}

THINK = "<think>\nadd them\n</think>\n\n3"
REASONING_CASES: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": "What is two plus two?"}]},
    "system": {"messages": [{"role": "system", "content": "Think step by step."}, USER]},
    "earlier_thought": {
        "messages": [USER, {"role": "assistant", "content": THINK}, {"role": "user", "content": "and 4?"}]
    },
    "answer_only_turn": {
        "messages": [USER, {"role": "assistant", "content": "3"}, {"role": "user", "content": "sure?"}]
    },
    "parts": {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Count"}, {"type": "text", "text": " to five."}],
            }
        ]
    },
}


def _request(body: dict[str, Any]) -> ab.GenerationRequest:
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        choice = choice["function"]["name"]
    params = ab.SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    return ab.GenerationRequest(body["messages"], params, tools=body.get("tools", ()), tool_choice=choice)


def _sent(backend: Any, request: ab.GenerationRequest) -> tuple[list[int], ab.GenerationResult]:
    """The prompt token ids the adapter hands the engine for ``request``, and its result."""
    engine = backend.engine
    add_request = engine.add_request
    seen: list[list[int]] = []

    async def spy(request_id: str, prompt: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(list(prompt["prompt_token_ids"]))
        return await add_request(request_id, prompt, *args, **kwargs)

    async def run() -> ab.GenerationResult:
        engine.add_request = spy
        try:
            return await backend.generate(request)
        finally:
            del engine.add_request  # the class's method again

    result = ab.get_loop_manager().run(run())
    assert len(seen) == 1
    return seen[0], result


def _check(pair: Pair, body: dict[str, Any]) -> None:
    served = pair.chat(**body, max_tokens=MAX_TOKENS)
    prompt, result = _sent(pair.backend, _request(body))
    assert prompt == served["prompt_token_ids"]
    # Named and required choices too: sampled under the server's constraint (test_vllm_serve_tool_calls.py).
    assert list(result.completions[0].token_ids) == served["choices"][0]["token_ids"]


@pytest.mark.parametrize("case", VLM_CASES)
def test_vlm_prompt_equals_vllm_serves(vlm_pair: Pair, case: str) -> None:
    _check(vlm_pair, VLM_CASES[case])


@pytest.mark.parametrize("case", REASONING_CASES)
def test_reasoning_template_prompt_equals_vllm_serves(reasoning_pair: Pair, case: str) -> None:
    _check(reasoning_pair, REASONING_CASES[case])
