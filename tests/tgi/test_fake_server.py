"""The look-alike itself: TGI's validation rules, error bodies and routes, checked against the spec."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from asyncbackends.testing import openapi
from asyncbackends.testing.fake_tgi import FakeTGIServer, Limits

from .conftest import MakeServer


@pytest_asyncio.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(client: aiohttp.ClientSession, server: FakeTGIServer, path: str, body: Any) -> tuple[int, Any]:
    async with client.post(server.url + path, json=body) as resp:
        text = await resp.text()
        return resp.status, json.loads(text) if resp.content_type == "application/json" else text


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"temperature": 0.0}, "`temperature` must be strictly positive"),
        ({"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),
        ({"top_p": 0.0}, "`top_p` must be > 0.0 and < 1.0"),
        ({"top_k": 0}, "`top_k` must be strictly positive"),
        ({"typical_p": 1.0}, "`typical_p` must be > 0.0 and < 1.0"),
        ({"repetition_penalty": 0.0}, "`repetition_penalty` must be strictly positive"),
        ({"frequency_penalty": 2.5}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
        ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "`stop` supports up to 4 stop sequences. Given: 5"),
        ({"best_of": 2}, "you must use sampling when `best_of` is > 1"),
        ({"best_of": 2, "do_sample": True, "seed": 3}, "`seed` must not be set when `best_of` > 1"),
        ({"best_of": 3, "do_sample": True}, "`best_of` must be > 0 and <= 2. Given: 3"),
        ({"top_n_tokens": 9}, "`top_n_tokens` must be >= 0 and <= 5. Given: 9"),
        ({"truncate": 0}, "`truncate` must be strictly positive and less than 4095. Given: 0"),
        (
            {"max_new_tokens": 4096},
            "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: 6 `inputs` tokens",
        ),
    ],
)
async def test_router_validation(
    server: FakeTGIServer, client: aiohttp.ClientSession, parameters: dict[str, Any], message: str
) -> None:
    status, body = await post(client, server, "/generate", {"inputs": "hello", "parameters": parameters})
    assert status == 422
    assert body["error_type"] == "validation" and body["error"].startswith(
        "Input validation error: " + message
    )
    assert [v for v in server.schema_violations if v.startswith("response")] == []
    server.schema_violations.clear()  # the request side breaks the spec on purpose


@pytest.mark.asyncio
async def test_empty_inputs_and_input_length(make_server: MakeServer, client: aiohttp.ClientSession) -> None:
    server = await make_server(limits=Limits(max_input_tokens=5, max_total_tokens=100))
    status, body = await post(
        client, server, "/generate", {"inputs": "", "parameters": {"max_new_tokens": 1}}
    )
    assert (status, body["error"]) == (422, "Input validation error: `inputs` cannot be empty")
    status, body = await post(
        client, server, "/generate", {"inputs": "hello", "parameters": {"max_new_tokens": 1}}
    )
    assert (status, body["error"]) == (
        422,
        "Input validation error: `inputs` must have less than 5 tokens. Given: 6",
    )
    assert server.schema_violations == []


@pytest.mark.asyncio
async def test_serde_type_errors_are_plain_text(server: FakeTGIServer, client: aiohttp.ClientSession) -> None:
    status, text = await post(client, server, "/generate", {"inputs": "x", "parameters": {"seed": -1}})
    assert status == 422 and text.startswith(
        "Failed to deserialize the JSON body into the target type: parameters.seed"
    )
    status, text = await post(client, server, "/generate", {"parameters": {}})
    assert status == 422 and "missing field `inputs`" in text
    server.schema_violations.clear()


@pytest.mark.asyncio
async def test_generate_details_prefill_and_headers(
    server: FakeTGIServer, client: aiohttp.ClientSession
) -> None:
    body = {"inputs": "abc", "parameters": {"max_new_tokens": 2, "decoder_input_details": True, "seed": 0}}
    async with client.post(server.url + "/generate", json=body) as resp:
        data = await resp.json()
        assert resp.headers["x-prompt-tokens"] == "4" and resp.headers["x-generated-tokens"] == "2"
    assert data["generated_text"] == "ab"
    assert [t["text"] for t in data["details"]["prefill"]] == ["<s>", "a", "b", "c"]
    assert data["details"]["prefill"][0]["logprob"] is None
    assert data["details"]["finish_reason"] == "length"
    assert server.schema_violations == []


@pytest.mark.asyncio
async def test_compat_route_best_of_and_full_text(
    server: FakeTGIServer, client: aiohttp.ClientSession
) -> None:
    params = {"max_new_tokens": 3, "best_of": 2, "do_sample": True, "return_full_text": True}
    status, data = await post(client, server, "/", {"inputs": "xyz", "parameters": params})
    assert status == 200 and isinstance(data, list) and len(data) == 1
    assert data[0]["generated_text"].startswith("xyz") and len(data[0]["details"]["best_of_sequences"]) == 1
    assert server.schema_violations == []


@pytest.mark.asyncio
async def test_generate_stream_sse(server: FakeTGIServer, client: aiohttp.ClientSession) -> None:
    body = {"inputs": "hey", "parameters": {"max_new_tokens": 10}}
    async with client.post(server.url + "/generate_stream", json=body) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        raw = (await resp.read()).decode()
    events = [json.loads(chunk[len("data:") :]) for chunk in raw.strip().split("\n\n")]
    assert [e["token"]["text"] for e in events] == ["h", "e", "y", "</s>"]
    assert events[-1]["generated_text"] == "hey" and events[-1]["details"]["finish_reason"] == "eos_token"
    assert all(e["generated_text"] is None for e in events[:-1])
    bad = {"inputs": "x", "parameters": {"decoder_input_details": True}}
    async with client.post(server.url + "/generate_stream", json=bad) as resp:
        assert resp.status == 422 and resp.content_type == "text/event-stream"
        error = json.loads((await resp.read()).decode().strip()[len("data:") :])
    assert error["error_type"] == "validation" and "not supported when streaming" in error["error"]
    assert server.schema_violations == []


@pytest.mark.asyncio
async def test_tokenize_offsets(server: FakeTGIServer, client: aiohttp.ClientSession) -> None:
    status, tokens = await post(client, server, "/tokenize", {"inputs": "héllo"})
    assert status == 200
    assert [(t["text"], t["start"], t["stop"]) for t in tokens[:3]] == [
        ("<s>", 0, 0),
        ("h", 0, 1),
        ("é", 1, 2),
    ]
    assert server.schema_violations == []


@pytest.mark.asyncio
async def test_info_and_health(make_server: MakeServer, client: aiohttp.ClientSession) -> None:
    server = await make_server(limits=Limits(max_concurrent_requests=7))
    async with client.get(server.url + "/info") as resp:
        info = await resp.json()
    assert (
        info["max_concurrent_requests"] == 7 and openapi.schema_errors("/components/schemas/Info", info) == []
    )
    server.healthy = False
    async with client.get(server.url + "/health") as resp:
        assert resp.status == 503 and (await resp.json())["error_type"] == "healthcheck"
    assert server.schema_violations == []


def test_spec_leniency_only_for_seed() -> None:
    params = "/components/schemas/GenerateParameters"
    assert openapi.schema_errors(params, {"seed": 0}) == []
    assert openapi.schema_errors(params, {"seed": -1}) != []
    assert (
        openapi.schema_errors(params, {"temperature": 0}) != []
        and openapi.schema_errors(params, {"top_k": None}) == []
    )


def test_the_command_line_serves_the_options_it_was_given() -> None:
    import subprocess
    import sys
    import urllib.request

    command = [sys.executable, "-m", "asyncbackends.testing.fake_tgi", "--model-id", "cli-model"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once it serves
        assert line.startswith("listening on http://127.0.0.1:"), line + process.stderr.read()
        with urllib.request.urlopen(line.split()[-1] + "/info", timeout=30) as response:
            assert json.loads(response.read())["model_id"] == "cli-model"
    finally:
        process.kill()
        process.communicate()
