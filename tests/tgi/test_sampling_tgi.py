"""The optional sampling parameters on TGI's wire: mapped onto its fields, or refused before sending.

Every exchange here is checked against TGI's OpenAPI spec by the look-alike (the fixtures fail a test whose
bodies break it), and the look-alike validates ``grammar`` as TGI's router does.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing import openapi
from asyncbackends.testing.fake_tgi import FakeTGIServer, Limits

from .conftest import MakeBackend, MakeServer, sent

NO_RETRY = ab.RetryPolicy(max_attempts=1)
PROMPT = "hello world"
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "integer", "minimum": 3}},
    "required": ["answer", "score"],
}
CHAT = [{"role": "user", "content": "Say yes or no."}]


async def one(backend: ab.AsyncBackend, prompt: Any, **params: Any) -> ab.GenerationResult:
    request = ab.GenerationRequest(prompt, ab.SamplingParams(**params))
    (result,) = await ab.gather(backend, [request], retry=NO_RETRY)
    assert isinstance(result, ab.GenerationResult)
    return result


def test_capabilities_say_what_tgi_honours() -> None:
    from asyncbackends.adapters.tgi import TGIBackend

    caps = TGIBackend(url="http://127.0.0.1:9").capabilities
    honoured = {n for n in ab._types.OPTIONAL_SAMPLING_PARAMS if getattr(caps, n)}
    assert honoured == {"repetition_penalty", "frequency_penalty", "json_schema", "regex"}


@pytest.mark.asyncio
async def test_penalties_are_tgi_fields_and_keep_greedy(
    server: FakeTGIServer, backend: ab.AsyncBackend
) -> None:
    result = await one(backend, PROMPT, max_tokens=4, repetition_penalty=1.3, frequency_penalty=-0.5)
    (body,) = sent(server)
    # Penalties are not warpers: greedy stays do_sample false, with no temperature.
    assert body["parameters"] == {
        "do_sample": False,
        "repetition_penalty": 1.3,
        "frequency_penalty": -0.5,
        "max_new_tokens": 4,
        "return_full_text": False,
        "details": True,
    }
    assert openapi.request_errors("/generate_stream", body) == []
    assert result.text == PROMPT[:4]


@pytest.mark.asyncio
async def test_json_schema_is_a_json_grammar(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    result = await one(backend, PROMPT, max_tokens=64, json_schema=SCHEMA)
    (body,) = sent(server)
    assert body["parameters"]["grammar"] == {"type": "json", "value": SCHEMA}
    assert openapi.request_errors("/generate_stream", body) == []
    # The look-alike's model obeys the grammar: the output is JSON valid against the schema.
    import jsonschema

    jsonschema.validate(json.loads(result.text), SCHEMA)


@pytest.mark.asyncio
async def test_regex_is_a_regex_grammar(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    result = await one(backend, PROMPT, max_tokens=16, temperature=0.8, seed=3, regex=r"(yes|no) [0-9]{2}")
    (body,) = sent(server)
    assert body["parameters"]["grammar"] == {"type": "regex", "value": r"(yes|no) [0-9]{2}"}
    assert body["parameters"]["do_sample"] is True
    assert openapi.request_errors("/generate_stream", body) == []
    assert re.fullmatch(r"(yes|no) [0-9]{2}", result.text)


@pytest.mark.asyncio
async def test_chat_route_takes_frequency_penalty_and_response_format(
    server: FakeTGIServer, backend: ab.AsyncBackend
) -> None:
    result = await one(backend, CHAT, max_tokens=32, frequency_penalty=0.4, regex="(yes|no)")
    (body,) = sent(server, "/v1/chat/completions")
    assert body["frequency_penalty"] == 0.4
    assert body["response_format"] == {"type": "regex", "value": "(yes|no)"}
    assert "presence_penalty" not in body and "repetition_penalty" not in body
    assert openapi.request_errors("/v1/chat/completions", body) == []
    assert result.text in ("yes", "no")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("prompt", "params", "named"),
    [
        (PROMPT, {"presence_penalty": 0.5}, "presence_penalty"),
        (PROMPT, {"min_p": 0.1}, "min_p"),
        (PROMPT, {"min_tokens": 2}, "min_tokens"),
        (PROMPT, {"min_p": 0.1, "min_tokens": 1, "repetition_penalty": 1.1}, "min_p, min_tokens"),
        (CHAT, {"presence_penalty": 0.5}, "presence_penalty"),
        (CHAT, {"repetition_penalty": 1.2}, "repetition_penalty"),
    ],
)
async def test_refused_before_anything_is_sent(
    server: FakeTGIServer, backend: ab.AsyncBackend, prompt: Any, params: dict[str, Any], named: str
) -> None:
    request = ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=4, **params))
    with pytest.raises(ab.RequestRejectedError, match=named):
        await backend.generate(request)
    assert server.received == []  # not even /info was needed to refuse it
    assert server.paths["/generate_stream"] == server.paths["/v1/chat/completions"] == 0


@pytest.mark.asyncio
async def test_router_refuses_a_schema_without_properties(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    # TGI's router compiles JSON grammars to a regex and needs `properties`: a 422, a RequestRejectedError.
    server = await make_server()
    backend = await make_backend(server.url)
    with pytest.raises(ab.RequestRejectedError, match="Grammar must have a 'properties' field"):
        await one(backend, PROMPT, max_tokens=4, json_schema={"type": "string"})
    with pytest.raises(ab.RequestRejectedError, match="grammar is not valid"):
        await one(backend, PROMPT, max_tokens=4, json_schema={"type": 12, "properties": {}})


@pytest.mark.asyncio
async def test_router_without_grammar_support_refuses(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(limits=Limits(grammar_support=False))
    backend = await make_backend(server.url)
    with pytest.raises(ab.RequestRejectedError, match="grammar is not supported"):
        await one(backend, PROMPT, max_tokens=4, regex="a+")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        ({"type": "lark", "value": "x"}, "unknown variant `lark`"),
        ({"type": "regex"}, "missing field `value`"),
        ({"type": "regex", "value": 3}, "expected a string"),
        ("json", "expected internally tagged enum GrammarType"),
    ],
)
async def test_look_alike_deserialises_grammar_like_serde(
    make_server: MakeServer, grammar: Any, message: str
) -> None:
    import aiohttp

    server = await make_server()
    server.allow_bad_requests = True  # type: ignore[attr-defined]
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 2, "grammar": grammar}}
    async with aiohttp.ClientSession() as session, session.post(server.url + "/generate", json=body) as resp:
        assert resp.status == 422
        assert message in await resp.text()


@pytest.mark.asyncio
async def test_look_alike_chat_presence_penalty_is_a_repetition_penalty(make_server: MakeServer) -> None:
    # Why the adapter never sends presence_penalty: TGI's router turns it into repetition_penalty + 2.
    from asyncbackends.testing._fake_tgi.validation import chat_to_generate

    body = chat_to_generate({"messages": CHAT, "presence_penalty": -2.5})
    assert body["parameters"]["repetition_penalty"] == -0.5
    server = await make_server()
    server.allow_bad_requests = True  # type: ignore[attr-defined]
    import aiohttp

    chat = {"messages": CHAT, "max_tokens": 2, "presence_penalty": -2.5}
    url = server.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as session, session.post(url, json=chat) as resp:
        assert resp.status == 422
        assert "`repetition_penalty` must be strictly positive" in await resp.text()
