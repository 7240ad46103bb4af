"""The chat contracts: met by the mock without images and tools, failed by adapters that break them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.mock import MockBackend
from asyncbackends.testing.contract import ChatContract


class TestMockWithoutImagesOrTools(ChatContract):
    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls) -> Iterator[ab.AsyncBackend]:
        backend = ab.create_backend("mock", images=False, tools=False)
        yield backend
        backend.close()


class AnswersAnyway(MockBackend):
    """Claims neither images nor tools, yet answers requests holding them (the refusal forgotten)."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        return ab.GenerationResult(request.request_id, (ab.Completion("a guess"),))


class WrongTool(MockBackend):
    """Claims tools but calls another tool than the one named, with arguments that break the schema."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        call = ab.ToolCall("call_0", "other", '{"answer": "maybe"}')
        return ab.GenerationResult(request.request_id, (ab.Completion("", tool_calls=(call,)),))


def _failure(test: Any, backend: ab.AsyncBackend) -> str:
    with pytest.raises(pytest.fail.Exception) as info:
        test(backend, ["Is the sky blue?", "Is grass red?"])
    return str(info.value)


def test_the_chat_contracts_fail_adapters_that_break_them() -> None:
    suite = ChatContract()
    anyway = AnswersAnyway(images=False, tools=False)
    message = _failure(suite.test_unclaimed_images_and_tools_refused, anyway)
    assert "capabilities.images is False but a request with images was answered" in message
    wrong = WrongTool()
    assert "a call to 'other'" in _failure(suite.test_named_tool_choice_obeyed, wrong)

    class RightNameBadArguments(WrongTool):
        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            call = ab.ToolCall("call_0", "answer", '{"answer": "maybe"}')
            return ab.GenerationResult(request.request_id, (ab.Completion("", tool_calls=(call,)),))

    assert "break the schema" in _failure(suite.test_named_tool_choice_obeyed, RightNameBadArguments())

    class LegacyFinishReason(WrongTool):
        # The wire's own word passed through: OpenAI's legacy "function_call" ("stop" is mapped by Completion).
        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            call = ab.ToolCall("call_0", "answer", '{"answer": "yes"}')
            completion = ab.Completion("", tool_calls=(call,), finish_reason="function_call")
            return ab.GenerationResult(request.request_id, (completion,))

    message = _failure(suite.test_named_tool_choice_obeyed, LegacyFinishReason())
    assert "finish_reason 'function_call' for a completion holding tool calls" in message
    # The real mock meets them.
    suite.test_named_tool_choice_obeyed(MockBackend(), ["Is the sky blue?", "Is grass red?"])
