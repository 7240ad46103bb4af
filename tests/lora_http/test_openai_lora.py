"""LoRA adapters on the ``openai`` adapter, through the OpenAI look-alikes (vLLM's server behaviour).

An adapter is the request's ``model`` on every route; ``lora_modules`` makes the backend load each adapter
once through ``POST /v1/load_lora_adapter``, refuse unknown names before sending, and key the cache on each
adapter's files. The real ``vllm serve`` is in test_vllm_serve_lora.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.openai import OpenAIBackend
from asyncbackends.testing.fake_openai_batches import FakeOpenAIBatchServer
from asyncbackends.testing.fake_openai_stream import FakeOpenAIServer

from .conftest import MakeAdapter

pytestmark = pytest.mark.asyncio


async def _backend(server: FakeOpenAIServer, **options: Any) -> OpenAIBackend:
    backend = await ab.acreate_backend("openai", base_url=server.url + "/v1", api_key="k", **options)
    assert isinstance(backend, OpenAIBackend)
    return backend


async def test_the_adapter_is_the_model_on_completions_and_chat_and_answers_differ() -> None:
    async with FakeOpenAIServer(lora_modules={"math": "/ckpt/math"}) as server:
        backend = await _backend(server)
        try:
            assert backend.capabilities.adapters
            requests = [
                ab.GenerationRequest("hello", adapter="math"),
                ab.GenerationRequest("hello"),
                ab.GenerationRequest([{"role": "user", "content": "hi"}], adapter="math"),
                ab.GenerationRequest([{"role": "user", "content": "hi"}]),
            ]
            results = await ab.gather(backend, requests)
        finally:
            await backend.aclose()
    texts = [r.completions[0].text for r in results]
    assert texts == ["[math] hello", "hello", "[math] hi", "hi"]
    sent = {(path, body["model"]) for path, body in server.received}
    assert len(server.received) == 4 and sent == {
        (path, model)
        for path in ("/v1/completions", "/v1/chat/completions")
        for model in ("math", "fake-openai")
    }
    assert results[0].model == "math" and results[1].model == "fake-openai"


async def test_an_unknown_adapter_is_the_servers_404_naming_it_never_retried() -> None:
    async with FakeOpenAIServer(lora_modules={"math": "/ckpt/math"}) as server:
        backend = await _backend(server)
        try:
            retry = ab.RetryPolicy(max_attempts=3, initial_delay=0.01)
            (error,) = await ab.gather(
                backend, [ab.GenerationRequest("hi", adapter="maths")], return_exceptions=True, retry=retry
            )
        finally:
            await backend.aclose()
    assert isinstance(error, ab.RequestRejectedError) and not error.retryable
    assert "adapter 'maths'" in str(error) and "The model `maths` does not exist" in str(error)
    assert len(server.received) == 1  # not retried


async def test_with_lora_modules_an_unknown_name_is_refused_before_sending(make_adapter: MakeAdapter) -> None:
    async with FakeOpenAIServer(runtime_lora_updating=True) as server:
        backend = await _backend(server, lora_modules={"math": make_adapter("math")})
        try:
            (error,) = await ab.gather(
                backend, [ab.GenerationRequest("hi", adapter="code")], return_exceptions=True
            )
        finally:
            await backend.aclose()
    assert isinstance(error, ab.RequestRejectedError) and "'code'" in str(error) and "'math'" in str(error)
    assert server.received == [] and not server.adapters.load_requests


async def test_an_adapter_is_loaded_once_under_concurrency_then_served(make_adapter: MakeAdapter) -> None:
    paths = {"math": make_adapter("math"), "code": make_adapter("code")}
    async with FakeOpenAIServer(runtime_lora_updating=True, lora_load_delay=0.05) as server:
        backend = await _backend(server, lora_modules=paths)
        try:
            requests = [ab.GenerationRequest(f"q{i}", adapter=("math", "code")[i % 2]) for i in range(20)]
            results = await ab.gather(backend, requests, concurrency=20)
            again = await ab.gather(backend, [ab.GenerationRequest("again", adapter="math")])
        finally:
            await backend.aclose()
    assert server.adapters.load_requests == {"math": 1, "code": 1}
    assert backend.adapters.loads == 2
    assert server.adapters.modules == paths  # loaded from the paths given
    assert [r.completions[0].text for r in results[:2]] == ["[math] q0", "[code] q1"]
    assert again[0].completions[0].text == "[math] again"


async def test_an_adapter_the_server_already_serves_is_not_loaded_again(make_adapter: MakeAdapter) -> None:
    path = make_adapter("math")
    async with FakeOpenAIServer(lora_modules={"math": path}, runtime_lora_updating=True) as server:
        backend = await _backend(server, lora_modules={"math": path})
        try:
            (result,) = await ab.gather(backend, [ab.GenerationRequest("x", adapter="math")])
        finally:
            await backend.aclose()
    assert result.completions[0].text == "[math] x" and not server.adapters.load_requests


async def test_a_server_without_the_load_route_is_a_clear_refusal(make_adapter: MakeAdapter) -> None:
    async with FakeOpenAIServer() as server:
        backend = await _backend(server, lora_modules={"math": make_adapter("math")})
        try:
            (error,) = await ab.gather(
                backend, [ab.GenerationRequest("x", adapter="math")], return_exceptions=True
            )
            (base,) = await ab.gather(backend, [ab.GenerationRequest("x")])
        finally:
            await backend.aclose()
    assert isinstance(error, ab.RequestRejectedError) and not error.retryable
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in str(error) and "'math'" in str(error)
    assert base.completions[0].text == "x"


async def test_a_load_the_server_refuses_names_the_adapter_and_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text('{"r": 8}')
    async with FakeOpenAIServer(runtime_lora_updating=True) as server:
        backend = await _backend(server, lora_modules={"bad": bad})
        # The adapter's files vanish after the backend read them: the server finds no adapter there.
        (bad / "adapter_config.json").unlink()
        try:
            requests = [ab.GenerationRequest(f"x{i}", adapter="bad") for i in range(5)]
            errors = await ab.gather(backend, requests, return_exceptions=True, concurrency=5)
        finally:
            await backend.aclose()
    for error in errors:
        assert isinstance(error, ab.RequestRejectedError)
        assert "could not load adapter 'bad'" in str(error) and "No adapter found" in str(error)
    assert server.adapters.load_requests == {"bad": 1}  # refused once, not asked again by each request


async def test_the_fingerprint_holds_each_adapters_digest_and_none_without_them(
    make_adapter: MakeAdapter,
) -> None:
    async with FakeOpenAIServer(runtime_lora_updating=True) as server:
        plain = await _backend(server)
        one = await _backend(server, lora_modules={"math": make_adapter("math")})
        same = await _backend(server, lora_modules={"math": make_adapter("math")})
        other = await _backend(server, lora_modules={"math": make_adapter("math2")})
        for backend in (plain, one, same, other):
            await backend.aclose()
    assert "lora_modules" not in plain.fingerprint
    digest = one.fingerprint["lora_modules"]["math"]
    assert digest.startswith("sha256:") and same.fingerprint == one.fingerprint
    assert other.fingerprint["lora_modules"]["math"] != digest  # other bytes under the same name


async def test_lora_modules_that_are_not_adapter_directories_are_refused_at_create(tmp_path: Path) -> None:
    async with FakeOpenAIServer() as server:
        with pytest.raises(ab.InvalidRequestError, match="lora_modules"):
            await _backend(server, lora_modules={"math": tmp_path / "missing"})


async def test_batch_lines_carry_the_adapter_as_their_model() -> None:
    async with FakeOpenAIBatchServer(adapters=("math",)) as server:
        backend = await ab.acreate_backend(
            "openai", base_url=server.url, api_key="k", model=server.model, batch_poll_interval=0.01
        )
        try:
            requests = [ab.GenerationRequest("hello", adapter="math"), ab.GenerationRequest("hello")]
            batched = await ab.gather(backend, requests, batch=True)
            inputs = [fid for fid, file in server.files.items() if file.get("purpose") == "batch"]
            lines = [line for fid in inputs for line in server.contents[fid].splitlines()]
        finally:
            await backend.aclose()
    models = sorted(json.loads(line)["body"]["model"] for line in lines)
    assert models == ["fake-batch-model", "math"]
    math, base = (r.completions[0].text for r in batched)
    assert math.startswith("[math]") and not base.startswith("[math]") and math == "[math]" + base


async def test_with_model_none_the_base_is_chosen_among_the_listed_adapters() -> None:
    async with FakeOpenAIServer(lora_modules={"math": "/ckpt/math", "code": "/ckpt/code"}) as server:
        backend = await _backend(server)
        await backend.aclose()
    assert backend.model == "fake-openai"
