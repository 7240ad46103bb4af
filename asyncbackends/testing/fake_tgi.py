"""`FakeTGIServer`: a text-generation-inference look-alike on aiohttp.web, for tests and benchmarks.

It speaks TGI's wire format (``POST /``, ``/generate``, ``/generate_stream``, ``/tokenize``,
``/v1/chat/completions``; ``GET /info``, ``/health``) with the router's validation rules, error bodies and
status codes (see `_fake_tgi.validation`), over the deterministic model in `_fake_tgi.model`, a vision model
whose inputs' markdown images (``![](url)``) are read as TGI's router reads them (`_fake_tgi.images`). Knobs
inject latency with jitter, 429/503/424 failures (by rate or for each input's first attempts), dropped
connections and hangs (see `_fake_tgi.faults`); counters record attempts and answers per input and the
peak of requests in flight; with ``check_schema`` every request and response is validated against the
OpenAPI spec and any violation kept in `schema_violations`.

Inside a test:

```python
async with FakeTGIServer(latency=0.01) as server:
    backend = ab.create_backend("tgi", url=server.url)
```

In its own process (benchmarks): ``python -m asyncbackends.testing.fake_tgi --latency 0.02``, which prints
``listening on http://127.0.0.1:PORT`` once it serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from .._install import pip_install
from ..adapters._minimal_match import NoMatchError
from ..adapters.tgi._wire import parse_lora_adapters

# Every request and response is checked against TGI's OpenAPI schema, which needs jsonschema: without it,
# fail here with the install command, not with an HTTP 500 on the first request.
if importlib.util.find_spec("jsonschema") is None:
    raise ModuleNotFoundError(
        "the look-alike TGI server checks requests against TGI's OpenAPI schema and needs jsonschema: "
        + pip_install("testing"),
        name="jsonschema",
    )

from . import openapi
from ._fake_tgi.faults import choose_failure, fail
from ._fake_tgi.images import read_images
from ._fake_tgi.model import FakeModel, Generation
from ._fake_tgi.responses import (
    chat_json,
    details_json,
    forced_tool_call,
    info_json,
    stream_events,
    timing_headers,
)
from ._fake_tgi.validation import (
    Limits as Limits,
)
from ._fake_tgi.validation import (
    ValidRequest,
    WireError,
    chat_to_generate,
    deserialize_parameters,
    parse_body,
)
from ._fake_tgi.validation import validate_generate as _validate
from ._serve import serve

__all__ = ["FakeTGIServer"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakeTGIServer:
    """A TGI look-alike listening on ``host`` (loopback) at ``port`` (0 picks a free one).

    Args:
        limits: The router's limits (`Limits`): input/total tokens, best_of, stop sequences, concurrency.
        latency: Seconds each generation takes before it answers.
        jitter: Extra seconds drawn uniformly from [0, jitter] per generation.
        rate_429: Probability a generation answers 429 "Model is overloaded".
        rate_503: Probability it answers a proxy's 503.
        rate_424: Probability it answers 424 "Request failed during generation".
        drop_rate: Probability the connection is dropped without an answer.
        hang_rate: Probability it never answers (until the client gives up or the server stops).
        fail_attempts: Each input's first ``fail_attempts`` attempts fail with ``failure``.
        failure: What those failures are: 429, 503, 424, 500, ``"drop"``, ``"hang"``, ``"freeze"`` (a
            hang that ``GET /health`` shares while it lasts, as TGI's does when a model shard is stuck in
            a step: its router passes the health check on to the shards) or ``"stall"`` (a stream stops
            sending after ``stall_after`` tokens and never ends; a route that does not stream hangs).
        token_interval: Seconds between two generated tokens: a stream sends each token when it is due, a
            route that does not stream answers once the last one is (a server generating at that pace).
        time_scale: Every wait of the server (latency, token interval) is multiplied by it, so a test plays
            a 20-minute generation in seconds (scale the client's timeouts by the same factor).
        stall_after: Tokens a ``"stall"`` stream sends before it stops.
        retry_after: A ``Retry-After`` header value for 429s (TGI sends none; proxies do).
        ready_after: Seconds after start during which ``GET /health`` answers 503.
        legacy_info: Report ``max_input_length`` in ``/info`` as TGI < 2.0 did, not ``max_input_tokens``.
        model_id: The ``model_id`` ``/info`` reports (the fake model's own by default); change the
            attribute to play a server redeployed with another model at the same URL.
        model_sha: The ``model_sha`` ``/info`` reports (the revision served).
        info_latency: Seconds ``GET /info`` takes before it answers.
        check_schema: Validate every exchange against the OpenAPI spec (violations in `schema_violations`).
        record: Keep every request body in `received` (path, body) and its headers in `headers_received`;
            `authorization` counts the ``Authorization`` header values seen either way.
        seed: Seed of the failure-injection and jitter generator.
        concurrency: Most generations served at once; the others queue for a slot, each taking
            ``latency`` once served (a server-bound engine). ``None``: no limit.
        lora_adapters: The LoRA adapter ids served, as TGI's launcher's ``--lora-adapters`` (its string,
            ``"math,code=/path"``, or a sequence of ids). A request naming one (``parameters.adapter_id``,
            or a chat's ``model`` other than ``"tgi"``) is answered by the model with that adapter (its echo
            starts with ``[id] ``, its logprobs lowered by a salt); any other id is answered by the base
            model without an error, as TGI does (its server's adapter index defaults to 0, the base).
        host: Address to listen on.
        port: Port to listen on; 0 picks a free one (read `url` after start).
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        latency: float = 0.0,
        jitter: float = 0.0,
        rate_429: float = 0.0,
        rate_503: float = 0.0,
        rate_424: float = 0.0,
        drop_rate: float = 0.0,
        hang_rate: float = 0.0,
        fail_attempts: int = 0,
        failure: int | str = 503,
        retry_after: str | None = None,
        ready_after: float = 0.0,
        legacy_info: bool = False,
        model_id: str | None = None,
        model_sha: str | None = None,
        info_latency: float = 0.0,
        check_schema: bool = True,
        record: bool = True,
        seed: int = 0,
        concurrency: int | None = None,
        token_interval: float = 0.0,
        time_scale: float = 1.0,
        stall_after: int = 0,
        lora_adapters: str | Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.limits = limits or Limits()
        self.latency, self.jitter = latency, jitter
        self.rates = {429: rate_429, 503: rate_503, 424: rate_424, "drop": drop_rate, "hang": hang_rate}
        self.fail_attempts, self.failure, self.retry_after = fail_attempts, failure, retry_after
        self.ready_after, self.legacy_info = ready_after, legacy_info
        self.check_schema, self.record = check_schema, record
        self.host, self.port = host, port
        self.model = FakeModel()
        self.model_id = model_id or self.model.model_id
        self.model_sha = model_sha
        self.info_latency = info_latency
        self.concurrency = concurrency
        self.token_interval, self.time_scale, self.stall_after = token_interval, time_scale, stall_after
        self._slots: asyncio.Semaphore | None = None
        self.lora_adapters: tuple[str, ...] = (
            (parse_lora_adapters(lora_adapters) if lora_adapters else ())
            if isinstance(lora_adapters, str)
            else tuple(lora_adapters)
        )
        self.adapter_answers: Counter[str | None] = Counter()  # generations answered, by adapter served
        self.healthy = True
        self.frozen = 0
        """Attempts frozen now (``failure="freeze"``): ``/health`` does not answer while there is one."""
        self._thawed: asyncio.Condition | None = None  # notified when a frozen attempt ends
        self._rng = random.Random(seed)
        self.attempts: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()  # inputs answered 200, by input
        self.statuses: Counter[int] = Counter()
        self.paths: Counter[str] = Counter()
        self.received: list[tuple[str, Any]] = []
        self.headers_received: list[dict[str, str]] = []
        self.authorization: Counter[str | None] = Counter()
        self.schema_violations: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._runner: web.AppRunner | None = None
        self._started = 0.0
        self._stopping: asyncio.Event | None = None

    # -- lifecycle -----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server root, for example ``http://127.0.0.1:41234``."""
        return f"http://{self.host}:{self.port}"

    def app(self) -> web.Application:
        """The aiohttp application (routes only; `start` serves it)."""
        # aiohttp's own cap sits well above TGI's limit, so an oversized body gets TGI's 413 (parse_body).
        app = web.Application(client_max_size=2 * self.limits.payload_limit + 2**20)
        post = {
            "/": self._compat,
            "/generate": self._generate,
            "/generate_stream": self._generate_stream,
            "/tokenize": self._tokenize,
            "/v1/chat/completions": self._chat,
        }
        for path, handler in post.items():
            app.router.add_post(path, handler)
        app.router.add_get("/info", self._info)
        app.router.add_get("/health", self._health)
        return app

    async def start(self) -> FakeTGIServer:
        """Start listening; `url` is valid afterwards."""
        self._stopping = asyncio.Event()
        self._thawed = asyncio.Condition()
        self._slots = asyncio.Semaphore(self.concurrency) if self.concurrency else None
        self._runner, self.port = await serve(self.app(), self.host, self.port)
        self._started = time.monotonic()
        return self

    async def stop(self) -> None:
        """Stop listening and drop every open connection (a server that goes away)."""
        if self._stopping is not None:
            self._stopping.set()
        if self._thawed is not None:
            async with self._thawed:
                self._thawed.notify_all()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> FakeTGIServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- plumbing ------------------------------------------------------------------------------------

    def _reply(
        self, path: str, status: int, body: Any, headers: dict[str, str] | None = None
    ) -> web.Response:
        self.statuses[status] += 1
        if self.check_schema and not (path == "/info" and self.legacy_info):
            method = "get" if path in ("/info", "/health") else "post"
            for problem in openapi.response_errors(path, status, body, method=method):
                self.schema_violations.append(f"response {status} {path}: {problem}")
        text = json.dumps(body, separators=(",", ":"), allow_nan=False)
        return web.Response(status=status, text=text, content_type="application/json", headers=headers)

    def _error(self, path: str, err: WireError, headers: dict[str, str] | None = None) -> web.Response:
        if not err.text:
            return self._reply(path, err.status, err.body, headers)
        # Plain-text errors come from the HTTP framework or a proxy, outside the spec: not schema-checked.
        self.statuses[err.status] += 1
        return web.Response(status=err.status, text=err.body, content_type="text/plain", headers=headers)

    async def _body(self, request: web.Request, path: str) -> Any:
        self.paths[path] += 1
        self.authorization[request.headers.get("Authorization")] += 1
        raw = await request.read()
        body = parse_body(request.headers.get("Content-Type", ""), raw, self.limits.payload_limit)
        if self.record:
            self.received.append((path, body))
            self.headers_received.append(dict(request.headers))
        if self.check_schema:
            self.schema_violations.extend(f"request {path}: {e}" for e in openapi.request_errors(path, body))
        return body

    async def _guarded(
        self, request: web.Request, path: str, run: Callable[[Any, str], Awaitable[Any]]
    ) -> Any:
        """Parse, count, bound concurrency, inject failures, then ``run(body)``; errors become responses."""
        try:
            body = await self._body(request, path)
            key = body.get("inputs") if isinstance(body, dict) else None
            key = key if isinstance(key, str) else json.dumps(body, sort_keys=True)
            self.attempts[key] += 1
            if self.in_flight >= self.limits.max_concurrent_requests:
                raise WireError.json_error(429, "Model is overloaded", "overloaded")
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                response = await run(body, key)
            finally:
                self.in_flight -= 1
            if getattr(response, "status", None) == 200:
                self.answered[key] += 1
            return response
        except WireError as err:
            headers = {"Retry-After": self.retry_after} if err.status == 429 and self.retry_after else None
            if path == "/generate_stream" and not err.text:
                # The spec gives a streamed route's errors as one server-sent event with the ErrorResponse.
                return await self._sse(request, path, err.status, [err.body], headers=headers)
            return self._error(path, err, headers)

    async def _inject(self, request: web.Request, key: str, *, stream: bool = False) -> bool:
        """Maybe fail this attempt, as configured; then sleep the latency. True: the stream is to stall."""
        failure = choose_failure(self.attempts[key], self.fail_attempts, self.failure, self.rates, self._rng)
        stall: bool = failure == "stall"
        if failure == "freeze":
            await self._freeze()
        await fail("hang" if stall and not stream else None if stall else failure, request, self._stopping)
        delay = (self.latency + (self._rng.uniform(0, self.jitter) if self.jitter else 0.0)) * self.time_scale
        if self._slots is not None:
            async with self._slots:
                await asyncio.sleep(delay)
        elif delay:
            await asyncio.sleep(delay)
        return stall

    async def _freeze(self) -> None:
        # Hangs until the client gives up (the handler is cancelled) or the server stops; /health with it.
        assert self._stopping is not None
        assert self._thawed is not None
        self.frozen += 1
        try:
            await self._stopping.wait()
        finally:
            self.frozen -= 1
            async with self._thawed:
                self._thawed.notify_all()
        raise asyncio.CancelledError

    def _validate(self, body: Any, *, stream: bool = False) -> ValidRequest:
        params = deserialize_parameters(body, extra={"stream": "bool", "add_special_tokens": "bool"})
        # A vision model: markdown images in the inputs are read as TGI's router reads them.
        count = self.model.num_tokens
        return _validate(body["inputs"], params, self.limits, count, stream=stream, read_inputs=read_images)

    def _served(self, req: ValidRequest) -> ValidRequest:
        """``req`` with the adapter the model runs: the one asked for if served, else the base (``None``)."""
        adapter = req.adapter_id if req.adapter_id in self.lora_adapters else None
        self.adapter_answers[adapter] += 1
        return dataclasses.replace(req, adapter_id=adapter)

    def _run_model(self, req: ValidRequest, seed: int | None = None) -> Generation:
        try:
            return self._generate_text(req, seed)
        except NoMatchError as exc:  # TGI fails such a grammar in the model server, after validation
            raise WireError.json_error(424, f"Request failed during generation: {exc}", "generation") from exc

    def _generate_text(self, req: ValidRequest, seed: int | None) -> Generation:
        return self.model.generate(
            req.model_inputs,
            max_new_tokens=req.max_new_tokens,
            do_sample=req.do_sample,
            seed=req.seed if seed is None else seed,
            stop=req.stop,
            truncate=req.truncate,
            grammar=req.grammar,
            adapter=req.adapter_id,
        )

    async def _one_generation(
        self, request: web.Request, body: Any, key: str
    ) -> tuple[ValidRequest, Generation, Any]:
        started = time.monotonic()
        req = self._served(self._validate(body))
        await self._inject(request, key)
        gen = self._run_model(req)
        if self.token_interval:  # the answer comes once its last token is generated
            await asyncio.sleep(len(gen.tokens) * self.token_interval * self.time_scale)
        text = req.inputs + gen.text if req.return_full_text else gen.text
        response: dict[str, Any] = {"generated_text": text}
        if req.details:
            details = details_json(self.model, req, gen)
            if req.best_of > 1:
                others = [
                    self._run_model(req, seed=self._rng.getrandbits(63)) for _ in range(req.best_of - 1)
                ]
                details["best_of_sequences"] = [
                    {**details_json(self.model, req, g), "generated_text": g.text} for g in others
                ]
            response["details"] = details
        return req, gen, (response, timing_headers(req, gen, started))

    # -- routes --------------------------------------------------------------------------------------

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        async def run(body: Any, key: str) -> web.StreamResponse:
            _, _, (response, headers) = await self._one_generation(request, body, key)
            return self._reply("/generate", 200, response, headers)

        result: web.StreamResponse = await self._guarded(request, "/generate", run)
        return result

    async def _compat(self, request: web.Request) -> web.StreamResponse:
        async def run(body: Any, key: str) -> web.StreamResponse:
            if isinstance(body, dict) and body.get("stream") is True:
                return await self._stream(request, body, "/", key)
            _, _, (response, headers) = await self._one_generation(request, body, key)
            return self._reply("/", 200, [response], headers)

        result: web.StreamResponse = await self._guarded(request, "/", run)
        return result

    async def _generate_stream(self, request: web.Request) -> web.StreamResponse:
        async def run(body: Any, key: str) -> web.StreamResponse:
            return await self._stream(request, body, "/generate_stream", key)

        result: web.StreamResponse = await self._guarded(request, "/generate_stream", run)
        return result

    async def _stream(self, request: web.Request, body: Any, path: str, key: str) -> web.StreamResponse:
        try:
            req = self._served(self._validate(body, stream=True))
            stall = await self._inject(request, key, stream=True)
        except WireError as err:
            if err.text or path == "/generate_stream":
                raise  # answered by _guarded, as an event
            # The spec gives streamed errors as one server-sent event carrying the ErrorResponse.
            return await self._sse(request, path, err.status, [err.body])
        events = stream_events(req, self._run_model(req))
        return await self._sse(request, path, 200, events, paced=True, stall=stall)

    async def _sse(
        self,
        request: web.Request,
        path: str,
        status: int,
        events: list[Any],
        *,
        paced: bool = False,
        stall: bool = False,
        headers: dict[str, str] | None = None,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=status, headers={"Content-Type": "text/event-stream", **(headers or {})}
        )
        await resp.prepare(request)
        self.statuses[status] += 1
        loop = asyncio.get_running_loop()
        interval = self.token_interval * self.time_scale if paced else 0.0
        start = loop.time()
        for index, event in enumerate(events):
            if stall and index == self.stall_after:
                assert self._stopping is not None
                await self._stopping.wait()  # sends nothing more, until the server stops
                raise asyncio.CancelledError
            if interval:
                # Each token when it is due, from the stream's start: a late wake-up sends the tokens that
                # fell due meanwhile at once, so the pace holds whatever the loop's timer resolution.
                wait = start + (index + 1) * interval - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
            if self.check_schema:
                problems = openapi.response_errors(path, status, event, content_type="text/event-stream")
                self.schema_violations.extend(f"event {status} {path}: {p}" for p in problems)
            await resp.write(b"data:" + json.dumps(event).encode() + b"\n\n")
        await resp.write_eof()
        return resp

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request, "/tokenize")
            deserialize_parameters(body, extra={"add_special_tokens": "bool"})
        except WireError as err:
            return self._error("/tokenize", err)
        special = body.get("add_special_tokens", True) is not False
        tokens = self.model.tokenize(body["inputs"], special)
        out = [{"id": i, "text": t, "start": a, "stop": b} for i, t, a, b in tokens]
        return self._reply("/tokenize", 200, out)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        async def run(body: Any, key: str) -> web.StreamResponse:
            started = time.monotonic()
            req, gen, _ = await self._one_generation(request, chat_to_generate(body), key)
            response = chat_json(self.model_id, req, gen, logprobs=bool(body.get("logprobs")))
            response = forced_tool_call(response, body)
            return self._reply("/v1/chat/completions", 200, response, timing_headers(req, gen, started))

        result: web.StreamResponse = await self._guarded(request, "/v1/chat/completions", run)
        return result

    async def _info(self, request: web.Request) -> web.StreamResponse:
        self.paths["/info"] += 1
        if self.info_latency:
            await asyncio.sleep(self.info_latency)
        info = info_json(self.model_id, self.limits, legacy=self.legacy_info, model_sha=self.model_sha)
        return self._reply("/info", 200, info)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        self.paths["/health"] += 1
        if self.frozen and self._thawed is not None and self._stopping is not None:
            stopping = self._stopping
            async with self._thawed:  # no answer while an attempt is frozen
                await self._thawed.wait_for(lambda: not self.frozen or stopping.is_set())
        if self.healthy and time.monotonic() - self._started >= self.ready_after:
            self.statuses[200] += 1
            return web.Response(status=200)
        return self._reply("/health", 503, {"error": "unhealthy", "error_type": "healthcheck"})


if __name__ == "__main__":
    from ._fake_tgi.cli import serve_until_killed, server_options

    serve_until_killed(FakeTGIServer(**server_options()))
