"""``reasoning_tags`` on the tgi adapter (and endpoints): the one text TGI returns split into thinking and
answer, stop strings applied to the answer only, bad tags refused before anything is sent. The look-alike
server's greedy generation echoes the prompt, so a prompt is the text the "model" generates."""

from __future__ import annotations

from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing.fake_tgi import FakeTGIServer

from .conftest import MakeBackend, sent

TAGS = ("<think>", "</think>")
pytestmark = pytest.mark.asyncio


def _request(prompt: str, **params: Any) -> ab.GenerationRequest:
    return ab.GenerationRequest(prompt, ab.SamplingParams(temperature=0, max_tokens=200, **params))


async def _one(backend: Any, request: ab.GenerationRequest) -> ab.Completion:
    [result] = await ab.gather(backend, [request])
    [completion] = result.completions
    return completion  # type: ignore[no-any-return]


async def test_the_text_is_split_and_stops_inside_the_thought_do_not_cut_it(
    server: FakeTGIServer, make_backend: MakeBackend
) -> None:
    backend = await make_backend(server.url, reasoning_tags=TAGS)
    assert backend.capabilities.reasoning
    thought, answer = "Question: two\n\nplus two", "It is four.\n\nQuestion: next"
    completion = await _one(backend, _request(thought + "</think>" + answer, stop=["\n\n", "Question:"]))
    assert completion.reasoning == thought
    assert completion.text == "It is four."
    assert completion.finish_reason == "stop" and not completion.reasoning_truncated
    # The server generated on past the stop (it was not sent): the answer is cut here.
    assert "stop" not in sent(server)[0]["parameters"]


async def test_a_start_tag_in_the_output_is_dropped_and_an_answer_without_stop_keeps_its_finish(
    server: FakeTGIServer, make_backend: MakeBackend
) -> None:
    backend = await make_backend(server.url, reasoning_tags=TAGS)
    completion = await _one(backend, _request("<think>a b</think> c", stop=["zz"]))
    assert (completion.reasoning, completion.text, completion.finish_reason) == ("a b", " c", "stop")
    eos = await _one(backend, _request("<think>a</think>b"))
    assert eos.finish_reason == "stop"  # the fake model's EOS, mapped


async def test_cut_off_while_thinking_gives_no_answer(
    server: FakeTGIServer, make_backend: MakeBackend
) -> None:
    backend = await make_backend(server.url, reasoning_tags=TAGS)
    request = ab.GenerationRequest("a long thought", ab.SamplingParams(temperature=0, max_tokens=6))
    completion = await _one(backend, request)
    assert completion.reasoning == "a long"
    assert completion.text == "" and completion.reasoning_truncated and completion.finish_reason == "length"


async def test_without_tags_the_text_is_untouched(server: FakeTGIServer, make_backend: MakeBackend) -> None:
    backend = await make_backend(server.url)
    assert not backend.capabilities.reasoning
    completion = await _one(backend, _request("a</think>b"))
    assert (completion.text, completion.reasoning) == ("a</think>b", None)


@pytest.mark.parametrize("tags", [("<think>",), ("", "</think>"), "<think>", ("<think>", 3), ["a", "b", "c"]])
async def test_bad_tags_are_refused_before_anything_is_sent(
    server: FakeTGIServer, make_backend: MakeBackend, tags: Any
) -> None:
    with pytest.raises(ab.InvalidRequestError, match="reasoning_tags must be a pair of non-empty strings"):
        await make_backend(server.url, reasoning_tags=tags)
    assert server.received == []
    with pytest.raises(ab.InvalidRequestError, match="reasoning_tags must be a pair"):
        await ab.acreate_backend("endpoints", name="e", protocol="tgi", reasoning_tags=tags)


async def test_logprobs_with_stops_and_tags_are_refused_before_sending(
    server: FakeTGIServer, make_backend: MakeBackend
) -> None:
    backend = await make_backend(server.url, reasoning_tags=TAGS)
    before = len(server.received)
    with pytest.raises(ab.RequestRejectedError, match="logprobs or stop, not both"):
        await _one(backend, _request("a</think>b", stop=["b"], logprobs=True))
    assert len(server.received) == before


async def test_endpoints_refuses_tags_on_an_openai_protocol_endpoint() -> None:
    with pytest.raises(ab.InvalidRequestError, match="returns the thinking itself"):
        await ab.acreate_backend("endpoints", name="e", protocol="openai", reasoning_tags=TAGS)
