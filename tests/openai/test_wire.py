"""The OpenAI wire format without an engine: a scripted stub for model choice, error mapping, generic servers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

import asyncbackends as ab
from asyncbackends.adapters.openai import OpenAIBackend
from asyncbackends.testing._serve import serve


class Stub:
    """Answers ``/v1/models`` with ``models`` and every POST with the next scripted (status, body, headers)."""

    def __init__(self, models: list[dict[str, Any]]) -> None:
        self.models = models
        self.script: list[tuple[int, Any, dict[str, str]]] = []
        self.received: list[tuple[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> Stub:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/{tail:.*}", self._post)
        self._runner, port = await serve(app)
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": self.models})

    async def _post(self, request: web.Request) -> web.Response:
        self.received.append((request.path, await request.json()))
        status, body, headers = self.script.pop(0)
        text = body if isinstance(body, str) else json.dumps(body)
        return web.Response(status=status, text=text, headers=headers, content_type="application/json")


def completion(text: str = "ok", **choice: Any) -> dict[str, Any]:
    return {
        "model": "m1",
        "choices": [{"index": 0, "text": text, "finish_reason": "length", **choice}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }


def oai_error(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[Stub]:
    server = await Stub([{"id": "m1", "object": "model", "owned_by": "openai"}]).start()
    yield server
    await server.stop()


@pytest_asyncio.fixture
async def backend(stub: Stub) -> AsyncIterator[OpenAIBackend]:
    built = await ab.acreate_backend("openai", base_url=stub.url, api_key="sk-stub")
    assert isinstance(built, OpenAIBackend)
    yield built
    await built.aclose()


@pytest.mark.asyncio
async def test_generic_server_gets_plain_openai_fields(stub: Stub, backend: OpenAIBackend) -> None:
    assert backend.server == "generic" and backend.model == "m1"
    assert not backend.capabilities.loglikelihood and not backend.capabilities.token_ids
    stub.script.append((200, completion("hi", logprobs={"tokens": ["hi"], "token_logprobs": [-0.5]}), {}))
    params = ab.SamplingParams(max_tokens=1, logprobs=True, seed=3, stop=("x",), top_p=0.5, temperature=0.7)
    (result,) = await ab.gather(backend, [ab.GenerationRequest("hello", params)])
    assert result.text == "hi" and result.completions[0].logprobs == (-0.5,) and result.prompt_tokens == 3
    # No token ids from a generic server: its token texts and its usage count are what it gives.
    assert result.completions[0].token_texts == ("hi",)
    assert result.completions[0].token_ids == () and result.completion_tokens == 1
    path, sent = stub.received[0]
    assert path == "/v1/completions"
    assert sent == {
        "model": "m1", "prompt": "hello", "max_tokens": 1, "temperature": 0.7, "top_p": 0.5,
        "seed": 3, "stop": ["x"], "logprobs": 0, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip


@pytest.mark.asyncio
async def test_chat_goes_to_chat_completions(stub: Stub, backend: OpenAIBackend) -> None:
    body = {
        "model": "m1",
        "choices": [
            {"index": 1, "message": {"role": "assistant", "content": "b"}, "finish_reason": "stop"},
            {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"},
        ],
    }
    stub.script.append((200, body, {}))
    request = ab.GenerationRequest(
        [{"role": "user", "content": "hi"}], ab.SamplingParams(n=2, temperature=1.0)
    )
    (result,) = await ab.gather(backend, [request])
    assert [c.text for c in result.completions] == ["a", "b"]  # in index order
    assert stub.received[0][0] == "/v1/chat/completions"
    assert (
        stub.received[0][1]["messages"] == [{"role": "user", "content": "hi"}]
        and stub.received[0][1]["n"] == 2
    )


@pytest.mark.asyncio
async def test_loglikelihood_refused_on_a_generic_server(stub: Stub, backend: OpenAIBackend) -> None:
    with pytest.raises(ab.RequestRejectedError, match="needs a vLLM server"):
        await ab.gather(backend, [ab.LoglikelihoodRequest("a", " b")])
    assert stub.received == []


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "body", "headers", "kind", "retryable"),
    [
        (400, oai_error("bad max_tokens"), {}, ab.RequestRejectedError, False),
        (401, oai_error("Incorrect API key provided", "invalid_request_error"), {}, ab.AuthenticationError, False),
        (403, oai_error("not allowed"), {}, ab.AuthenticationError, False),
        (404, oai_error("The model `m2` does not exist"), {}, ab.RequestRejectedError, False),
        (429, oai_error("Rate limit reached", "requests"), {"Retry-After": "7"}, ab.RateLimitedError, True),
        (429, oai_error("You exceeded your quota", "insufficient_quota", "insufficient_quota"), {},
         ab.RequestRejectedError, False),
        (500, oai_error("internal error", "server_error"), {}, ab.BackendError, True),
        (503, "<html>upstream unavailable</html>", {}, ab.BackendUnavailableError, True),
    ],
)  # fmt: skip
async def test_errors_are_mapped(
    stub: Stub,
    backend: OpenAIBackend,
    status: int,
    body: Any,
    headers: dict[str, str],
    kind: type[ab.BackendError],
    retryable: bool,
) -> None:
    stub.script.append((status, body, headers))
    (error,) = await ab.gather(
        backend,
        [ab.GenerationRequest("x", request_id="q")],
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert type(error) is kind and error.retryable is retryable and error.request_id == "q"
    assert f"HTTP {status}" in str(error) and "sk-stub" not in str(error)
    if isinstance(body, dict):
        assert body["error"]["message"] in str(error)
    if headers.get("Retry-After"):
        assert isinstance(error, ab.RateLimitedError) and error.retry_after == 7.0


@pytest.mark.asyncio
async def test_several_models_ask_to_choose(stub: Stub) -> None:
    stub.models = [{"id": "m1", "owned_by": "x"}, {"id": "m2", "owned_by": "x"}]
    with pytest.raises(ab.InvalidRequestError, match="serves 2 models; choose one with model=: m1, m2"):
        await ab.acreate_backend("openai", base_url=stub.url)
    chosen = await ab.acreate_backend("openai", base_url=stub.url, model="m2")
    assert isinstance(chosen, OpenAIBackend) and chosen.model == "m2"
    await chosen.aclose()


@pytest.mark.asyncio
async def test_no_model_listed(stub: Stub) -> None:
    stub.models = []
    with pytest.raises(ab.InvalidRequestError, match="lists no model"):
        await ab.acreate_backend("openai", base_url=stub.url)


@pytest.mark.asyncio
async def test_unreachable_server() -> None:
    with pytest.raises(ab.BackendUnavailableError, match="connection failed"):
        await ab.acreate_backend("openai", base_url="http://127.0.0.1:9/v1")
    # With a model named, the list is not needed: the failure comes with the first request, retryable.
    lazy = await ab.acreate_backend("openai", base_url="http://127.0.0.1:9/v1", model="m")
    (error,) = await ab.gather(
        lazy, [ab.GenerationRequest("x")], retry=ab.RetryPolicy(max_attempts=1), return_exceptions=True
    )
    assert isinstance(error, ab.BackendUnavailableError) and error.retryable
    await lazy.aclose()


@pytest.mark.asyncio
async def test_api_key_from_environment(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    built = await ab.acreate_backend("openai", base_url=stub.url)
    assert "sk-from-env" not in repr(vars(built)) and "sk-from-env" not in repr(vars(built._http))  # type: ignore[attr-defined]
    assert built._http._auth_header.get_secret_value() == "Bearer sk-from-env"  # type: ignore[attr-defined]
    await built.aclose()


@pytest.mark.asyncio
async def test_max_tokens_zero_sends_nothing(stub: Stub, backend: OpenAIBackend) -> None:
    (result,) = await ab.gather(backend, [ab.GenerationRequest("x", ab.SamplingParams(max_tokens=0))])
    assert result.text == "" and result.completions[0].finish_reason == "length" and stub.received == []
