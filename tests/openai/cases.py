"""The requests both engines answer: the in-process reference (reference.py) and the served model."""

from __future__ import annotations

import asyncbackends as ab

GREEDY = [
    ab.GenerationRequest("The quick brown fox", ab.SamplingParams(max_tokens=12)),
    ab.GenerationRequest("Paris is the capital of", ab.SamplingParams(max_tokens=8, logprobs=True)),
    ab.GenerationRequest([0, 74, 75, 322], ab.SamplingParams(max_tokens=6)),
    ab.GenerationRequest([{"role": "user", "content": "hello there"}], ab.SamplingParams(max_tokens=6)),
    ab.GenerationRequest("Numbers: 0 1 2", ab.SamplingParams(max_tokens=10, stop=("5",))),
]

SCORED = [
    ab.LoglikelihoodRequest("Paris is the capital of", " France"),
    ab.LoglikelihoodRequest("The quick brown fox jumps over the ", "lazy dog."),
    ab.LoglikelihoodRequest("", "hello there"),
    ab.LoglikelihoodRequest("Question: What is two plus two? Answer:", " four"),
    ab.LoglikelihoodRequest("abc", "d"),
]

ROLLING = [ab.RollingLoglikelihoodRequest("Once upon a time there was a small model that lived on a CPU.")]

ENGINE_OPTIONS = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 512,
}

# Tools on the served model. The tool is closed (one enum property, no others), so a random-weight model
# constrained to its schema ends the arguments within a few tokens instead of writing digits to max_tokens.
CITY = ab.Tool(
    "city",
    "Name a capital city.",
    {
        "type": "object",
        "properties": {"name": {"enum": ["Paris", "Berlin"]}},
        "required": ["name"],
        "additionalProperties": False,
    },
)
ASK = {"role": "user", "content": "Which city is the capital of France?"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "city", "arguments": '{"name": "Paris"}'}}
# "auto" output is read by the server's tool parser; the random weights never write a call of their own, so
# one case makes the model spell one (in the pythonic parser's format) under a regex matching only it.
PYTHONIC_CALL = "[city(name='Paris')]"
PYTHONIC_REGEX = PYTHONIC_CALL.replace("[", "\\[").replace("]", "\\]").replace("(", "\\(").replace(")", "\\)")

TOOLS = {
    "named": ab.GenerationRequest([ASK], ab.SamplingParams(max_tokens=48), tools=[CITY], tool_choice="city"),
    "required": ab.GenerationRequest(
        [ASK], ab.SamplingParams(max_tokens=64), tools=[CITY], tool_choice="required"
    ),
    "second_turn": ab.GenerationRequest(
        [
            ASK,
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Paris"},
        ],
        ab.SamplingParams(max_tokens=8),
        tools=[CITY],
    ),
    "auto_forced": ab.GenerationRequest(
        [ASK], ab.SamplingParams(max_tokens=48, regex=PYTHONIC_REGEX), tools=[CITY], tool_choice="auto"
    ),
}
"""Tool requests both engines answer: ``tool_choice`` a name, ``"required"``, ``"auto"``; a second turn."""

TOOL_PARSER = "pythonic"
"""The server's ``--tool-call-parser`` and the reference's ``tool_parser``.

Not ``hermes``: with a parser that has an xgrammar structural tag (hermes, llama3_json, ...), vLLM 0.32's server
constrains a forced choice to the parser's call format with free arguments (unless a tool is ``strict`` or the
server runs ``--tool-strict-level parameter``) and whitespace allowed whatever ``disable_any_whitespace``
says, so the random weights pad the call to ``max_tokens``. The pythonic parser has none: a forced choice is
constrained to vLLM's JSON schema of the tool (compact), as the in-process adapter constrains it.
"""
