"""How the openai adapter asks for each answer (`_http.delivery`), and that no path waits without a bound.

Against the streaming look-alike, which counts the answers it streamed and sent whole: a vLLM server's chats
and tool requests are sent whole and watched by its ``GET /health``; everything else under an idle limit is
streamed, a generic server's tool requests included (it has no health route to watch them by); without an
idle limit every answer is sent whole.
"""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters._http.delivery import choose_delivery

from .conftest import Make, until

TOOL = ab.Tool("add", "Add two integers.", {"type": "object", "properties": {"x": {"type": "integer"}}})
ONCE = ab.RetryPolicy(max_attempts=1)
FAST = ab.RetryPolicy(max_attempts=2, initial_delay=0.001, max_delay=0.01)


def request(text: str, *, chat: bool, tools: bool) -> ab.GenerationRequest:
    prompt: Any = [{"role": "user", "content": text}] if chat else text
    return ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=16), tools=[TOOL] if tools else ())


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("owned_by", "chat", "tools", "timeout", "answer"),
    [
        ("fake", False, False, ab.Timeouts(), "streamed"),
        ("fake", True, False, ab.Timeouts(), "streamed"),
        ("fake", True, True, ab.Timeouts(), "streamed"),  # no health route: the stream is the bound
        ("vllm", False, False, ab.Timeouts(), "streamed"),
        ("vllm", True, False, ab.Timeouts(), "whole"),  # watched by GET /health
        ("vllm", True, True, ab.Timeouts(), "whole"),
        ("fake", True, True, 30.0, "whole"),  # no idle limit: nothing needs the stream
        ("vllm", False, False, 30.0, "whole"),
    ],
)
async def test_each_path_is_streamed_or_sent_whole(
    make: Make, owned_by: str, chat: bool, tools: bool, timeout: Any, answer: str
) -> None:
    server, backend = await make(owned_by=owned_by)
    (result,) = await ab.gather(backend, [request("an answer", chat=chat, tools=tools)], timeout=timeout)
    assert result.text == "an answer"
    assert server.answers == {answer: 1}


@pytest.mark.asyncio
async def test_a_stalled_tool_request_on_a_generic_server_ends_in_a_retryable_idle_timeout(
    make: Make,
) -> None:
    # No total: before the idle limit bounded this path, the attempt waited for ever.
    server, backend = await make(fail_attempts=1, failure="stall")
    assert backend.server == "generic"
    (error,) = await ab.gather(
        backend, [request("a stalled call", chat=True, tools=True)],
        timeout=ab.Timeouts(total=None, idle=0.5), retry=ONCE, return_exceptions=True,
    )  # fmt: skip
    assert type(error) is ab.BackendTimeoutError and error.retryable
    assert "no data from the server for 0.5 s (the idle timeout)" in str(error)
    assert server.attempts["a stalled call"] == 1
    # The next attempt is answered at once: a roomier limit, so a loaded machine cannot cut it too.
    (result,) = await ab.gather(
        backend, [request("a stalled call", chat=True, tools=True)],
        timeout=ab.Timeouts(total=None, idle=5), retry=FAST,
    )  # fmt: skip
    assert result.text == "a stalled call" and server.answers == {"streamed": 1}


@pytest.mark.asyncio
async def test_a_frozen_vllm_server_ends_a_tool_request_in_a_retryable_idle_timeout(make: Make) -> None:
    server, backend = await make(owned_by="vllm", sick_attempts=1)
    (error,) = await ab.gather(
        backend, [request("a frozen server", chat=True, tools=True)],
        timeout=ab.Timeouts(total=None, idle=0.5), retry=ONCE, return_exceptions=True,
    )  # fmt: skip
    assert type(error) is ab.BackendTimeoutError and error.retryable and "GET /health" in str(error)
    await until(lambda: server._sick == 0)  # the abandoned exchange was closed on the server


def test_a_route_that_can_be_neither_streamed_nor_watched_is_refused() -> None:
    with pytest.raises(ValueError, match="no idle bound"):
        choose_delivery(5.0, can_stream=False, streams_exactly=False, watched=False)
    assert choose_delivery(None, can_stream=False, streams_exactly=False, watched=False) == "whole"
