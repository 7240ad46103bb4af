"""`ChatContract`: images and tools refused where unclaimed; tool calls of the promised shape where claimed.

A backend whose `Capabilities` lack ``images`` or ``tools`` must refuse a request holding them with
`RequestRejectedError` naming them, before sending anything. A backend that claims ``tools`` must obey a
named ``tool_choice``: every completion holds at least one `ToolCall` to that tool, with a non-empty id and,
unless the completion was cut by ``max_tokens``, arguments that are JSON valid against the tool's schema.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from ..._chat import Tool
from ..._protocol import AsyncBackend
from ..._types import GenerationRequest, SamplingParams
from ...errors import RequestRejectedError
from ._base import ContractBase, added_in, expect
from .sampling import _schema_problem

__all__ = ["ChatContract"]

# A 1x1 PNG: the smallest image every vision stack decodes.
_PNG_URL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
# Closed, so a model of random weights constrained to it finishes within a few tokens.
_ANSWER = Tool(
    "answer",
    "Answer yes or no.",
    {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    },
)


class ChatContract(ContractBase):
    """Images and tools: refused where unclaimed, a named tool choice obeyed where ``tools`` is claimed.

    Knobs: ``tool`` (the `Tool` the named-choice check offers; closed, so constrained output ends) and
    ``structured_max_tokens`` (room for its arguments).
    """

    tool: ClassVar[Tool] = _ANSWER
    """The tool the named tool choice check forces."""
    structured_max_tokens: ClassVar[int] = 64
    """Tokens a constrained output (the tool's arguments) may take."""

    @added_in(3)
    def test_unclaimed_images_and_tools_refused(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """A request with images or tools the backend does not claim is refused, naming them."""
        requests: dict[str, GenerationRequest] = {}
        params = SamplingParams(max_tokens=self.max_tokens)
        if not backend.capabilities.images:
            content: list[dict[str, Any]] = [{"type": "text", "text": prompts[0]}]
            content.append({"type": "image_url", "image_url": {"url": _PNG_URL}})
            requests["images"] = GenerationRequest(({"role": "user", "content": content},), params, "images")
        if not backend.capabilities.tools:
            message = ({"role": "user", "content": prompts[0]},)
            requests["tools"] = GenerationRequest(message, params, "tools", tools=(self.tool,))
        if not requests:
            pytest.skip(f"backend {backend.name!r} claims images and tools")
        for what, request in requests.items():
            try:
                result = self.call(backend.generate(request))
            except RequestRejectedError as exc:
                expect(what in str(exc), f"the refusal of {what} does not name it: {exc}")
                continue
            expect(
                False,
                f"capabilities.{what} is False but a request with {what} was answered "
                f"({result.text!r}) instead of refused with RequestRejectedError",
            )

    @added_in(3)
    def test_named_tool_choice_obeyed(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """A named tool choice gives calls to that tool: ids set, arguments valid JSON for its schema."""
        self.require(backend, "tools")
        self.require(backend, "chat")
        for index, prompt in enumerate(prompts[:2]):
            request = GenerationRequest(
                ({"role": "user", "content": prompt},),
                SamplingParams(max_tokens=self.structured_max_tokens),
                f"tool-{index}",
                tools=(self.tool,),
                tool_choice=self.tool.name,
            )
            result = self.call(backend.generate(request))
            for completion in result.completions:
                calls = completion.tool_calls
                expect(bool(calls), f"tool_choice={self.tool.name!r}: no tool call in {completion!r}")
                for call in calls:
                    expect(
                        call.name == self.tool.name,
                        f"tool_choice={self.tool.name!r}: a call to {call.name!r}",
                    )
                    expect(bool(call.id), f"a tool call without an id: {call!r}")
                if completion.finish_reason == "length":
                    continue  # cut by max_tokens: the arguments may be unfinished
                # `Completion` turns "stop" (or none) into "tool_calls" itself: what fails here is an engine's
                # or wire's own word passed through (OpenAI's legacy "function_call", an "eos_token").
                expect(
                    completion.finish_reason == "tool_calls",
                    f"finish_reason {completion.finish_reason!r} for a completion holding tool calls "
                    "(expected 'tool_calls', or 'length' when cut by max_tokens)",
                )
                for call in calls:
                    try:
                        arguments = json.loads(call.arguments)
                    except ValueError as exc:
                        expect(False, f"tool call arguments {call.arguments!r} are not JSON ({exc})")
                    problem = _schema_problem(arguments, self.tool.parameters)
                    expect(
                        problem is None, f"tool call arguments {call.arguments!r} break the schema: {problem}"
                    )
