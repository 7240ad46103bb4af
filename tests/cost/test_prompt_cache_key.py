"""``prompt_cache_key``: few-shot prompts that open alike name one provider cache; other servers never see it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

import asyncbackends as ab
from asyncbackends.adapters.openai._wire import completion_payload, sends_prompt_cache_key
from asyncbackends.testing._serve import serve

SHOTS = "".join(f"Q: what is {k} + {k}?\nA: {2 * k}\n\n" for k in range(40))  # longer than 256 characters


def chat(text: str) -> ab.GenerationRequest:
    return ab.GenerationRequest([{"role": "user", "content": text}])


@pytest.mark.parametrize(
    ("url", "sends"),
    [
        ("https://api.openai.com/v1", True),
        ("https://eu.api.openai.com/v1", True),
        ("https://my-resource.openai.azure.com/openai/v1", True),
        ("http://localhost:8000/v1", False),
        ("https://notopenai.com/v1", False),
        ("https://openai.com.example.org/v1", False),
    ],
)
def test_the_key_goes_to_openais_own_api_only(url: str, sends: bool) -> None:
    assert sends_prompt_cache_key(url) is sends


def test_prompts_that_open_alike_share_a_key_and_others_do_not() -> None:
    a = completion_payload("m", chat(SHOTS + "Q: what is 7 + 9?\nA:"), vllm=False, cache_key=True)
    b = completion_payload("m", chat(SHOTS + "Q: what is 1 + 2?\nA:"), vllm=False, cache_key=True)
    other = completion_payload("m", chat("Another task entirely. " + SHOTS), vllm=False, cache_key=True)
    text = completion_payload("m", ab.GenerationRequest(SHOTS + "Q: 3?"), vllm=False, cache_key=True)
    assert a["prompt_cache_key"] == b["prompt_cache_key"]
    assert a["prompt_cache_key"] != other["prompt_cache_key"]
    assert len(text["prompt_cache_key"]) == 32
    assert "prompt_cache_key" not in completion_payload("m", chat(SHOTS), vllm=False)


class Recorder:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.url = ""
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.runner, port = await serve(app)
        self.url = f"http://127.0.0.1:{port}/v1"

    async def chat(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        message = {"role": "assistant", "content": "ok"}
        return web.json_response({"model": "m", "choices": [{"index": 0, "message": message,
                                  "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})  # fmt: skip


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    ab.get_loop_manager().run(server.start())
    yield server
    assert server.runner is not None
    ab.get_loop_manager().run(server.runner.cleanup())


def test_a_server_that_is_not_openais_never_gets_the_field(recorder: Recorder) -> None:
    backend = ab.create_backend("openai", base_url=recorder.url, model="m")
    ab.run_batch(backend, [chat(SHOTS + "Q: 1?")], timeout=ab.Timeouts(total=30, idle=None))
    assert len(recorder.bodies) == 1 and "prompt_cache_key" not in recorder.bodies[0]
    backend.close()
