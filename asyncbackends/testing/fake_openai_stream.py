"""`FakeOpenAIServer`: a small OpenAI-compatible look-alike that streams, paces its tokens and stalls.

It serves ``GET /v1/models``, ``GET /health``, ``POST /v1/completions`` and ``POST /v1/chat/completions``,
both answered whole or, with ``stream: true``, as ``chunk`` events ending in ``data: [DONE]`` (a final
``usage`` chunk when ``stream_options.include_usage`` asks for it), as OpenAI's API reference gives them. The
model is `_fake_tgi.model`'s (greedy echoes the prompt, or a chat's last message; sampling shuffles it with
the seed); special tokens are never part of an answer. A prompt plus ``max_tokens`` over ``max_model_len`` is
refused as OpenAI refuses it: 400, ``code: "context_length_exceeded"``.

Knobs: ``token_interval`` (seconds a token) scaled by ``time_scale``, so a test plays a long generation in
seconds; ``fail_attempts`` with ``failure="stall"`` (the stream stops after ``stall_after`` tokens until the
server stops; an answer sent whole never comes) or an HTTP status. ``owned_by="vllm"`` lists the model as
vLLM's server does, so the openai adapter takes it for one (and sends its chats whole, watching ``/health``);
``whole_after_checks`` holds each answer sent whole until that many health checks were answered after it came
(for ever when nothing probes); ``sick_attempts`` makes each prompt's first attempts sent whole hang, and
``/health`` with them, as a frozen server would. Counters: ``attempts`` per prompt, ``streamed`` / ``whole``
answers, ``health_checks``.

```python
async with FakeOpenAIServer(token_interval=0.05, time_scale=0.01) as server:
    backend = await ab.acreate_backend("openai", base_url=server.url + "/v1")
```
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ._fake_openai.lora import ServedAdapters
from ._fake_tgi.model import FakeModel, Generation
from ._serve import serve

__all__ = ["FakeOpenAIServer"]


class FakeOpenAIServer:
    """An OpenAI-compatible look-alike on ``host`` at ``port`` (0 picks a free one); see the module docstring.

    Args:
        model: The model name it lists and answers with.
        max_model_len: The context length: prompt tokens plus ``max_tokens`` above it are refused.
        token_interval: Seconds between two generated tokens.
        time_scale: Multiplies every wait of the server.
        fail_attempts: Each prompt's first ``fail_attempts`` attempts fail with ``failure``.
        failure: ``"stall"`` or an HTTP status (429, 500, 503...) answered with OpenAI's error body.
        stall_after: Tokens a stalled stream sends before it stops.
        owned_by: The ``owned_by`` of its model list entry (``"vllm"`` to pass for a vLLM server).
        whole_after_checks: Health checks answered after an answer sent whole came, before it is sent.
        sick_attempts: Each prompt's first ``sick_attempts`` attempts sent whole hang, and so does
            ``/health`` while one of them is in flight.
        lora_modules: LoRA adapters served from the start, by name: their paths (``vllm serve
            --lora-modules name=path``). Each is a model name of its own (listed by ``/v1/models``); a
            request naming one is answered by the model with that adapter (its echo starts with ``[name] ``,
            its logprobs lowered by a salt); a model name neither the base nor an adapter is vLLM's 404
            (`_fake_openai.lora`). `received` keeps every generation request's (path, body).
        runtime_lora_updating: Serve ``POST /v1/load_lora_adapter`` as vLLM does with
            ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (a loaded adapter joins ``lora_modules``).
        lora_load_delay: Seconds a load takes, so that loads sent together overlap.
        host: Address to listen on.
        port: Port to listen on.
    """

    def __init__(
        self,
        *,
        model: str = "fake-openai",
        max_model_len: int = 4096,
        token_interval: float = 0.0,
        time_scale: float = 1.0,
        fail_attempts: int = 0,
        failure: int | str = "stall",
        stall_after: int = 0,
        owned_by: str = "fake",
        whole_after_checks: int = 0,
        sick_attempts: int = 0,
        lora_modules: Mapping[str, str] | None = None,
        runtime_lora_updating: bool = False,
        lora_load_delay: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.model_name, self.max_model_len = model, max_model_len
        self.token_interval, self.time_scale = token_interval, time_scale
        self.fail_attempts, self.failure, self.stall_after = fail_attempts, failure, stall_after
        self.host, self.port = host, port
        self.owned_by = owned_by
        self.whole_after_checks, self.sick_attempts = whole_after_checks, sick_attempts
        self.health_checks = 0
        self._sick = 0  # sick attempts in flight: /health does not answer while there is one
        self._checked = asyncio.Condition()  # notified at each health check answered
        self.model = FakeModel()
        self.adapters = ServedAdapters(
            model, lora_modules or {}, runtime_loading=runtime_lora_updating, load_delay=lora_load_delay
        )
        self.received: list[tuple[str, Any]] = []  # (path, body) of every generation request
        self.attempts: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()  # "streamed" / "whole" / the error statuses
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()

    @property
    def url(self) -> str:
        """The server root (the API is under ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> FakeOpenAIServer:
        """Start listening; `url` is valid afterwards."""
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        self.adapters.route(app)
        self._runner, self.port = await serve(app, self.host, self.port)
        return self

    async def stop(self) -> None:
        """Stop listening; stalled streams end."""
        self._stopping.set()
        async with self._checked:
            self._checked.notify_all()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> FakeOpenAIServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _models(self, request: web.Request) -> web.Response:
        entry = {
            "id": self.model_name,
            "object": "model",
            "owned_by": self.owned_by,
            "max_model_len": self.max_model_len,
        }
        data = [entry, *self.adapters.entries(self.owned_by)]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        async with self._checked:
            await self._checked.wait_for(lambda: not self._sick or self._stopping.is_set())
            self.health_checks += 1
            self._checked.notify_all()
        return web.Response(status=200)

    async def _until_checks(self, count: int) -> None:
        target = self.health_checks + count
        async with self._checked:
            await self._checked.wait_for(lambda: self.health_checks >= target or self._stopping.is_set())

    async def _sick_attempt(self) -> None:
        # Hangs until the client gives up (cancelled) or the server stops; /health hangs meanwhile.
        self._sick += 1
        try:
            await self._stopping.wait()
        finally:
            self._sick -= 1
            async with self._checked:
                self._checked.notify_all()
        raise asyncio.CancelledError

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await request.json()
        self.received.append((request.path, body))
        refused = self.adapters.refusal(body.get("model"))
        if refused is not None:
            self.answers[str(refused.status)] += 1
            return refused
        adapter = self.adapters.adapter(body.get("model"))
        text = str(body["messages"][-1]["content"]) if chat else str(body["prompt"])
        self.attempts[text] += 1
        max_tokens = int(body.get("max_tokens") or 16)
        prompt_tokens = self.model.num_tokens(text)
        if prompt_tokens + max_tokens > self.max_model_len:
            message = (
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."
            )
            return self._error(400, message, "invalid_request_error", "context_length_exceeded")
        stall = self.attempts[text] <= self.fail_attempts and self.failure == "stall"
        if self.attempts[text] <= self.fail_attempts and not stall:
            return self._error(int(self.failure), "injected failure", "server_error", None)
        temperature = float(body.get("temperature", 1.0))
        seed = body.get("seed")
        stop = body.get("stop") or []
        gens = [
            self.model.generate(
                text,
                max_new_tokens=max_tokens,
                do_sample=temperature > 0,
                seed=None if seed is None else seed + i,
                stop=[stop] if isinstance(stop, str) else list(stop),
                adapter=adapter,
            )
            for i in range(int(body.get("n") or 1))
        ]
        base = {"id": "cmpl-fake", "created": int(time.time()), "model": adapter or self.model_name}
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": sum(len(_visible(g)) for g in gens),
            "total_tokens": prompt_tokens + sum(len(_visible(g)) for g in gens),
        }
        if not body.get("stream"):
            if stall:
                await self._stopping.wait()
                raise asyncio.CancelledError
            if self.attempts[text] <= self.sick_attempts:
                await self._sick_attempt()
            await self._until_checks(self.whole_after_checks)
            await asyncio.sleep(max(len(g.tokens) for g in gens) * self.token_interval * self.time_scale)
            choices = [_choice(i, g, chat, bool(body.get("logprobs"))) for i, g in enumerate(gens)]
            self.answers["whole"] += 1
            kind = "chat.completion" if chat else "text_completion"
            return web.json_response({**base, "object": kind, "choices": choices, "usage": usage})
        return await self._stream(request, body, gens, base, usage, chat=chat, stall=stall)

    async def _stream(
        self,
        request: web.Request,
        body: Any,
        gens: list[Generation],
        base: dict[str, Any],
        usage: dict[str, Any],
        *,
        chat: bool,
        stall: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        logprobs = bool(body.get("logprobs"))

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk = {**base, "object": kind, "choices": choices, **extra}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        loop = asyncio.get_running_loop()
        start = loop.time()
        interval = self.token_interval * self.time_scale
        visible = [_visible(g) for g in gens]
        if chat:
            await send(
                [{"index": i, "delta": {"role": "assistant", "content": ""}} for i in range(len(gens))]
            )
        for step in range(max(len(v) for v in visible)):
            if stall and step == self.stall_after:
                await self._stopping.wait()
                raise asyncio.CancelledError
            wait = start + (step + 1) * interval - loop.time()
            if interval and wait > 0:
                await asyncio.sleep(wait)
            parts = [_token_part(i, v[step], chat, logprobs) for i, v in enumerate(visible) if step < len(v)]
            await send(parts)
        finals = [{"index": i, "finish_reason": _finish(g)} for i, g in enumerate(gens)]
        for final in finals:
            final["delta" if chat else "text"] = {} if chat else ""
        await send(finals)
        if (body.get("stream_options") or {}).get("include_usage"):
            await send([], usage=usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self.answers["streamed"] += 1
        return resp

    def _error(self, status: int, message: str, kind: str, code: str | None) -> web.Response:
        self.answers[str(status)] += 1
        error = {"message": message, "type": kind, "param": None, "code": code}
        return web.json_response({"error": error}, status=status)


def _visible(gen: Generation) -> list[Any]:
    return [t for t in gen.tokens if not t.special]


def _finish(gen: Generation) -> str:
    return "length" if gen.finish_reason == "length" else "stop"


def _token_part(index: int, token: Any, chat: bool, logprobs: bool) -> dict[str, Any]:
    part: dict[str, Any] = {"index": index, "finish_reason": None}
    if chat:
        part["delta"] = {"content": token.text}
        if logprobs:
            part["logprobs"] = {
                "content": [{"token": token.text, "logprob": token.logprob, "top_logprobs": []}]
            }
    else:
        part["text"] = token.text
        if logprobs:
            part["logprobs"] = {
                "tokens": [token.text],
                "token_logprobs": [token.logprob],
                "top_logprobs": [None],
            }
    return part


def _choice(index: int, gen: Generation, chat: bool, logprobs: bool) -> dict[str, Any]:
    tokens = _visible(gen)
    text = "".join(t.text for t in tokens)
    choice: dict[str, Any] = {"index": index, "finish_reason": _finish(gen), "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
        if logprobs:
            choice["logprobs"] = {
                "content": [{"token": t.text, "logprob": t.logprob, "top_logprobs": []} for t in tokens]
            }
    else:
        choice["text"] = text
        if logprobs:
            choice["logprobs"] = {
                "tokens": [t.text for t in tokens],
                "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [None] * len(tokens),
            }
    return choice
