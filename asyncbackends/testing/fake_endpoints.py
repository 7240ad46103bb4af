"""`FakeEndpointsAPI`: a look-alike of Hugging Face's Inference Endpoints API and its proxy, on aiohttp.web.

It answers the routes huggingface_hub calls (``GET /api/whoami-v2``; under ``/v2/endpoint/{namespace}``:
create, get, delete, ``pause``, ``resume``, ``scale-to-zero``) with the JSON shapes
``InferenceEndpoint.from_raw`` parses, and plays the endpoint's lifecycle on a clock: a created or
resumed endpoint goes through ``startup`` (``pending`` then ``initializing`` by default) before
``running``, or ends in ``failed`` with `FakeEndpoint.fail_message`. Each endpoint's ``status.url``
points at this server's proxy (``/proxy/{namespace}/{name}``), which forwards to ``upstream`` (a
`FakeTGIServer`, say) while the endpoint runs, and otherwise acts as the Endpoints proxy does: a request
to a scaled-to-zero endpoint wakes it; with an ``X-Scale-Up-Timeout`` header the request is held until
the endpoint runs (or that many seconds pass), without one it gets a 503 at once.

Point huggingface_hub at it by setting ``huggingface_hub.constants.INFERENCE_ENDPOINTS_ENDPOINT`` to
``api.url + "/v2"`` and ``huggingface_hub.constants.ENDPOINT`` to ``api.url`` (pytest's ``monkeypatch``)::

    async with FakeTGIServer() as tgi, FakeEndpointsAPI(upstream=tgi.url, token="hf_x") as api:
        api.add("my-endpoint", state="paused")
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from ._serve import serve

__all__ = ["FakeEndpoint", "FakeEndpointsAPI"]

_HOP_BY_HOP = {
    "content-length",
    "transfer-encoding",
    "connection",
    "content-encoding",
    "keep-alive",
    "date",
    "server",
}


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class FakeEndpoint:
    """One endpoint's state. Edit the fields from a test to script what happens next.

    Attributes:
        name: Endpoint name.
        namespace: Its namespace (user or organisation).
        state: The state reported now (advanced by the clock through `timeline`).
        message: ``status.message``.
        image: ``model.image`` (``{"tgi": {...}}`` by default; ``{"vllm": {...}}`` for an OpenAI image).
        fail_message: When set, the next start-up ends in ``failed`` with this message.
        timeline: Pending transitions: (monotonic time, state).
        actions: The lifecycle calls received (``"create"``, ``"pause"``, ``"resume"``...).
        proxied: The paths the proxy received, in order.
        env: ``model.env``, the container's environment (``{"LORA_ADAPTERS": "a,b"}`` for TGI's LoRA
            adapters, as the Endpoints UI sets them).
    """

    name: str
    namespace: str
    state: str = "running"
    message: str = "Endpoint is ready"
    repository: str = "acme/tiny-model"
    image: dict[str, Any] = field(default_factory=lambda: {"tgi": {"url": "ghcr.io/huggingface/tgi:latest"}})
    health_route: str = "/health"
    fail_message: str | None = None
    timeline: list[tuple[float, str]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    proxied: list[str] = field(default_factory=list)
    created_at: str = field(default_factory=_now_iso)
    env: dict[str, str] = field(default_factory=dict)

    def advance(self) -> str:
        """Apply the transitions that are due and return the current state."""
        now = time.monotonic()
        while self.timeline and self.timeline[0][0] <= now:
            _, self.state = self.timeline.pop(0)
            if self.state == "failed":
                self.message = self.fail_message or "failed"
            elif self.state == "running":
                self.message = "Endpoint is ready"
        return self.state


class FakeEndpointsAPI:
    """The Endpoints API look-alike and endpoint proxy, listening on loopback.

    Args:
        upstream: The URL the proxy forwards a running endpoint's requests to (a TGI look-alike).
        token: The only bearer token accepted (``None`` accepts any request).
        startup: (state, seconds) steps a starting endpoint goes through before ``running``.
        user: The user name ``whoami`` reports (the default namespace).
        action_latency: Seconds each lifecycle call (delete, pause, resume, scale-to-zero) takes to answer.
        host: Address to listen on.
        port: Port; 0 picks a free one.
    """

    def __init__(
        self,
        *,
        upstream: str,
        token: str | None = None,
        startup: Sequence[tuple[str, float]] = (("pending", 0.05), ("initializing", 0.05)),
        user: str = "tester",
        action_latency: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.token = token
        self.startup = tuple(startup)
        self.user = user
        self.action_latency = action_latency
        self.host, self.port = host, port
        self.endpoints: dict[tuple[str, str], FakeEndpoint] = {}
        self.created: list[dict[str, Any]] = []  # create payloads, as received
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        """The server root (the Hub endpoint); the Endpoints API lives under ``/v2``."""
        return f"http://{self.host}:{self.port}"

    def add(self, name: str, *, namespace: str | None = None, **fields: Any) -> FakeEndpoint:
        """Add an endpoint in the given state (``running`` by default)."""
        endpoint = FakeEndpoint(name=name, namespace=namespace or self.user, **fields)
        self.endpoints[(endpoint.namespace, name)] = endpoint
        return endpoint

    def start_up(self, endpoint: FakeEndpoint, steps: Sequence[tuple[str, float]] | None = None) -> None:
        """Schedule ``steps`` (the configured start-up by default) then ``running`` (or ``failed``)."""
        at = time.monotonic()
        endpoint.timeline = []
        for state, seconds in self.startup if steps is None else steps:
            endpoint.timeline.append((at, state))
            at += seconds
        endpoint.timeline.append((at, "failed" if endpoint.fail_message else "running"))
        endpoint.advance()

    # -- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> FakeEndpointsAPI:
        """Start listening; `url` is valid afterwards."""
        app = web.Application()
        app.router.add_get("/api/whoami-v2", self._whoami)
        app.router.add_post("/v2/endpoint/{ns}", self._create)
        app.router.add_get("/v2/endpoint/{ns}/{name}", self._get)
        app.router.add_delete("/v2/endpoint/{ns}/{name}", self._delete)
        app.router.add_post("/v2/endpoint/{ns}/{name}/{action}", self._action)
        app.router.add_route("*", "/proxy/{ns}/{name}/{tail:.*}", self._proxy)
        self._runner, self.port = await serve(app, self.host, self.port)
        return self

    async def stop(self) -> None:
        """Stop listening and close the proxy's client."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def __aenter__(self) -> FakeEndpointsAPI:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the API -------------------------------------------------------------------------------------

    def _raw(self, ep: FakeEndpoint) -> dict[str, Any]:
        state = ep.advance()
        url = f"{self.url}/proxy/{ep.namespace}/{ep.name}" if state in ("running", "scaledToZero") else None
        return {
            "name": ep.name,
            "type": "protected",
            "accountId": None,
            "compute": {
                "accelerator": "gpu",
                "instanceSize": "x1",
                "instanceType": "nvidia-a10g",
                "scaling": {"maxReplica": 1, "minReplica": 0, "scaleToZeroTimeout": 15},
            },
            "model": {
                "repository": ep.repository,
                "revision": None,
                "task": "text-generation",
                "framework": "pytorch",
                "image": ep.image,
                "env": ep.env,
            },
            "provider": {"region": "us-east-1", "vendor": "aws"},
            "healthRoute": ep.health_route,
            "status": {
                "createdAt": ep.created_at,
                "createdBy": {"id": "1", "name": self.user},
                "updatedAt": _now_iso(),
                "updatedBy": {"id": "1", "name": self.user},
                "private": None,
                "state": state,
                "message": ep.message,
                "readyReplica": 1 if state == "running" else 0,
                "targetReplica": 1 if state not in ("paused", "scaledToZero") else 0,
                "url": url,
            },
        }

    def _authorised(self, request: web.Request) -> bool:
        return self.token is None or request.headers.get("Authorization") == f"Bearer {self.token}"

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status)

    def _find(self, request: web.Request) -> FakeEndpoint | web.Response:
        if not self._authorised(request):
            return self._error(401, "Invalid credentials in Authorization header")
        key = (request.match_info["ns"], request.match_info["name"])
        endpoint = self.endpoints.get(key)
        if endpoint is None:
            return self._error(404, f"Endpoint {key[1]} not found in namespace {key[0]}")
        return endpoint

    async def _whoami(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._error(401, "Invalid credentials in Authorization header")
        return web.json_response({"type": "user", "name": self.user, "id": "1", "auth": {}})

    async def _create(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._error(401, "Invalid credentials in Authorization header")
        payload = await request.json()
        self.created.append(payload)
        ns, name = request.match_info["ns"], payload["name"]
        if (ns, name) in self.endpoints:
            return self._error(409, f"Endpoint {name} already exists")
        endpoint = self.add(name, namespace=ns, repository=payload["model"]["repository"], state="pending")
        if payload["model"].get("image"):
            endpoint.image = payload["model"]["image"]
        endpoint.actions.append("create")
        self.start_up(endpoint)
        return web.json_response(self._raw(endpoint))

    async def _get(self, request: web.Request) -> web.Response:
        found = self._find(request)
        return found if isinstance(found, web.Response) else web.json_response(self._raw(found))

    async def _delete(self, request: web.Request) -> web.Response:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        if self.action_latency:
            await asyncio.sleep(self.action_latency)
        found.actions.append("delete")
        del self.endpoints[(found.namespace, found.name)]
        return web.json_response({})

    async def _action(self, request: web.Request) -> web.Response:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        if self.action_latency:
            await asyncio.sleep(self.action_latency)
        action = request.match_info["action"]
        state = found.advance()
        found.actions.append(action)
        if action == "pause":
            found.timeline, found.state = [], "paused"
        elif action == "scale-to-zero":
            found.timeline, found.state = [], "scaledToZero"
        elif action == "resume":
            if state == "running":
                return self._error(400, "Endpoint is already running")
            self.start_up(found)
        else:
            return self._error(404, f"no such action {action!r}")
        return web.json_response(self._raw(found))

    # -- the proxy -----------------------------------------------------------------------------------

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        found.proxied.append("/" + request.match_info["tail"])
        state = found.advance()
        if state == "scaledToZero":
            found.actions.append("wake")
            self.start_up(found, [("initializing", self.startup[-1][1] if self.startup else 0.0)])
            state = found.state
        if state != "running":
            hold = request.headers.get("X-Scale-Up-Timeout")
            deadline = time.monotonic() + (float(hold) if hold else 0.0)
            # The state moves on a clock, not on an event: polling it is the honest model.
            while found.advance() not in ("running", "failed") and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            if found.state != "running":
                return web.Response(status=503, text="503 Service Unavailable", content_type="text/plain")
        return await self._forward(request)

    async def _forward(self, request: web.Request) -> web.Response:
        if self._client is None:
            self._client = aiohttp.ClientSession()
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        url = f"{self.upstream}/{request.match_info['tail']}"
        async with self._client.request(request.method, url, data=body or None, headers=headers) as resp:
            data = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP_BY_HOP}
            return web.Response(status=resp.status, body=data, headers=out)
