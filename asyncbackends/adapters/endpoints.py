"""`EndpointsBackend` (name ``endpoints``): a Hugging Face Inference Endpoint, lifecycle and requests.

Building one finds the endpoint through huggingface_hub's Inference Endpoints API (creating it when
``create`` holds `create_inference_endpoint`'s arguments and it does not exist), brings it to ``running``
(resuming a paused one, waking a scaled-to-zero one with a request the proxy holds), waits until its health
route answers, then hands every request to an inner adapter on the endpoint's URL: `TGIBackend` (TGI's wire
format, the default) or `OpenAIBackend` (an OpenAI-compatible image such as vLLM's). huggingface_hub is
blocking, so each of its calls runs in a worker thread, never on the shared loop.

Every request carries ``X-Scale-Up-Timeout``: if the endpoint scales to zero mid-run, the Endpoints proxy
holds the request while it scales back up instead of answering 503. A 503 that still comes back is a
retryable `BackendUnavailableError`, which `gather` retries. `aclose` pauses, scales to zero or deletes the
endpoint as ``on_close`` says (and does so too when building fails after the endpoint was started).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from typing import Any, Literal

from ..errors import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    InvalidRequestError,
    RequestRejectedError,
)
from ..protocol import BaseBackend, Secret
from ..types import (
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
)
from ._http import HTTPTransport, error_for_status, poll_until_ok, resolve_token
from .openai import OpenAIBackend
from .tgi import TGIBackend

__all__ = ["EndpointsBackend"]

log = logging.getLogger(__name__)
OnClose = Literal["keep", "pause", "scale_to_zero", "delete"]
WireProtocol = Literal["tgi", "openai"]
_ON_CLOSE = {"keep": None, "pause": "pause", "scale_to_zero": "scale_to_zero", "delete": "delete"}
_OPENAI_IMAGES = ("vllm", "sglang", "llamacpp")


class EndpointsBackend(BaseBackend):
    """One Inference Endpoint. Build it with `create` (``ab.create_backend("endpoints", name=...)``).

    Attributes:
        endpoint_name: The endpoint's name.
        namespace: Its namespace (user or organisation).
        url: Its URL.
        protocol: The wire format its requests use: ``"tgi"`` or ``"openai"``.
        raw: The endpoint's description as the API last returned it.
    """

    name = "endpoints"

    def __init__(
        self,
        inner: TGIBackend | OpenAIBackend,
        lifecycle: _Lifecycle,
        *,
        raw: Mapping[str, Any],
        protocol: WireProtocol,
        on_close: OnClose,
    ) -> None:
        self._inner = inner
        self._lifecycle = lifecycle
        self.raw = dict(raw)
        self.endpoint_name = lifecycle.name
        self.namespace = lifecycle.namespace
        self.url: str = raw["status"]["url"]
        self.protocol = protocol
        self.on_close = on_close
        self.capabilities = inner.capabilities

    @classmethod
    async def create(
        cls,
        *,
        name: str,
        namespace: str | None = None,
        token: str | Secret | bool | None = None,
        create: Mapping[str, Any] | None = None,
        wait_timeout: float = 1800.0,
        on_close: OnClose = "keep",
        protocol: WireProtocol | None = None,
        model: str | None = None,
        poll_interval: float = 5.0,
        scale_up_timeout: float = 600.0,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 256,
        max_concurrency: int | None = None,
    ) -> EndpointsBackend:
        """Find (or create) the endpoint, bring it to ``running``, wait for its health route, and wrap it.

        Args:
            name: The endpoint's name.
            namespace: Its namespace; ``None`` is the token's user (huggingface_hub's ``whoami``).
            token: A Hugging Face token; ``None`` uses huggingface_hub's (``HF_TOKEN``, the saved login).
            create: Arguments for ``HfApi.create_inference_endpoint`` (``repository``, ``framework``,
                ``accelerator``, ``instance_size``, ``instance_type``, ``region``, ``vendor``...), used
                only when the endpoint does not exist.
            wait_timeout: Seconds to wait for ``running`` and a healthy server, all together.
            on_close: What `aclose` does to the endpoint: ``"keep"``, ``"pause"``, ``"scale_to_zero"`` or
                ``"delete"``.
            protocol: ``"tgi"`` or ``"openai"``; ``None`` detects it from the endpoint's image (vLLM, SGLang
                and llama.cpp images speak OpenAI; anything else TGI).
            model: The model name for an OpenAI-protocol endpoint (``None``: the only one it serves).
            poll_interval: Seconds between status polls.
            scale_up_timeout: The ``X-Scale-Up-Timeout`` sent with every request: how long the proxy may
                hold a request while a scaled-to-zero endpoint starts.
            timeout: Seconds one HTTP request may take; ``None`` for no limit.
            headers: Extra headers for every request.
            max_connections: Size of the connection pool.
            max_concurrency: The concurrency `gather` uses when given none.

        Raises:
            InvalidRequestError: An invalid option.
            RequestRejectedError: The endpoint does not exist (and ``create`` is not given).
            AuthenticationError: The token was refused.
            BackendUnavailableError: The endpoint failed (its own message is quoted).
            BackendTimeoutError: Not running and healthy within ``wait_timeout``.
        """
        _check(name, create, on_close, protocol, wait_timeout, poll_interval, scale_up_timeout)
        lifecycle = _Lifecycle(name, namespace, resolve_token(token), poll_interval)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_timeout
        extra = {**(headers or {}), "X-Scale-Up-Timeout": f"{scale_up_timeout:g}"}
        try:
            raw = await lifecycle.bring_up(create, wait_timeout, extra)
            url = str(raw["status"]["url"]).rstrip("/")
            proto: WireProtocol = protocol or _detect_protocol(raw)
            health = raw.get("healthRoute") or ("/health" if proto == "tgi" else "/v1/models")
            await lifecycle.wait_healthy(url, health, max(0.0, deadline - loop.time()), extra)
            options: dict[str, Any] = {
                "timeout": timeout,
                "headers": extra,
                "max_connections": max_connections,
                "max_concurrency": max_concurrency,
            }
            inner: TGIBackend | OpenAIBackend
            if proto == "openai":
                inner = await OpenAIBackend.create(
                    base_url=url + "/v1", api_key=lifecycle.token, model=model, **options
                )
            else:
                inner = TGIBackend(url=url, token=lifecycle.token, **options)
        except BaseException:
            if lifecycle.touched and on_close != "keep":
                await lifecycle.finish(on_close, quiet=True)
            raise
        return cls(inner, lifecycle, raw=raw, protocol=proto, on_close=on_close)

    def __repr__(self) -> str:
        where = f"{self.namespace}/{self.endpoint_name}"
        return f"EndpointsBackend({where}, url={self.url!r}, protocol={self.protocol!r})"

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What identifies this backend's outputs: the endpoint and the model it serves (no secret)."""
        model = self.raw.get("model") or {}
        return {
            "name": self.name,
            "endpoint": f"{self.namespace}/{self.endpoint_name}",
            "repository": model.get("repository"),
            "revision": model.get("revision"),
        }

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """See `AsyncBackend.generate`; sent in the endpoint's wire format."""
        self._check_open(request.request_id)
        return await self._inner.generate(request)

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """See `AsyncBackend.loglikelihood`; as the inner adapter can (TGI cannot tell ``is_greedy``)."""
        self._check_open(request.request_id)
        return await self._inner.loglikelihood(request)

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Rolling loglikelihood where the inner adapter supports it (OpenAI protocol on vLLM)."""
        self._check_open(request.request_id)
        return await self._inner.loglikelihood_rolling(request)

    async def check_ready(self) -> None:
        """The inner adapter's readiness probe (TGI ``/health`` or ``/v1/models``), for a pool.

        Raises:
            BackendError: The endpoint does not answer as ready.
        """
        self._check_open()
        await self._inner.check_ready()

    async def _aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            await self._lifecycle.finish(self.on_close)


class _Lifecycle:
    """huggingface_hub's Inference Endpoints calls for one endpoint, each in a worker thread."""

    def __init__(self, name: str, namespace: str | None, token: Secret, poll_interval: float) -> None:
        self.name = name
        self.namespace = namespace
        self.token = token
        self.poll_interval = poll_interval
        self.touched = False  # whether we created, resumed or woke it (on_close then applies on failure)

    def __repr__(self) -> str:
        return f"_Lifecycle({self.namespace}/{self.name})"

    async def call(self, method: str, **kwargs: Any) -> Mapping[str, Any]:
        """Run ``HfApi().<method>(name, namespace=..., token=...)`` in a thread; the endpoint's raw JSON."""
        from huggingface_hub import HfApi

        token = self.token.get_secret_value() or False
        fn = functools.partial(
            getattr(HfApi(), method), self.name, namespace=self.namespace, token=token, **kwargs
        )
        try:
            endpoint = await asyncio.to_thread(fn)
        except Exception as exc:
            raise _hub_error(exc, f"{method} {self.namespace or '(your namespace)'}/{self.name}") from exc
        if endpoint is None:  # delete returns nothing
            return {}
        self.namespace = endpoint.namespace
        return dict(endpoint.raw)

    async def bring_up(
        self, create: Mapping[str, Any] | None, wait_timeout: float, headers: Mapping[str, str]
    ) -> Mapping[str, Any]:
        """Get (or create) the endpoint and wait until it is ``running`` with a URL."""
        try:
            raw = await self.call("get_inference_endpoint")
        except RequestRejectedError as exc:
            if create is None or "HTTP 404" not in exc.message:
                raise
            raw = await self.call("create_inference_endpoint", **create)
            self.touched = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_timeout
        resumed = False
        while True:
            status = raw.get("status") or {}
            state, url = status.get("state"), status.get("url")
            message = status.get("message") or status.get("errorMessage") or "(no message)"
            if state == "running" and url:
                return raw
            if state in ("failed", "updateFailed"):
                raise BackendUnavailableError(
                    f"Inference Endpoint {self.namespace}/{self.name} is {state}: {message}",
                    backend=EndpointsBackend.name,
                    retryable=False,
                )
            if state == "paused" and not resumed:
                raw, resumed, self.touched = await self.call("resume_inference_endpoint"), True, True
                continue
            left = deadline - loop.time()
            if state == "scaledToZero" and url and left > 0:
                # The proxy starts a scaled-to-zero endpoint on the first request; this one it holds.
                self.touched = True
                await self._request(url, raw.get("healthRoute") or "/", left, headers)
            elif left <= 0:
                raise BackendTimeoutError(
                    f"Inference Endpoint {self.namespace}/{self.name} still {state} after {wait_timeout} s: "
                    f"{message}",
                    backend=EndpointsBackend.name,
                )
            else:
                await asyncio.sleep(min(self.poll_interval, left))
            raw = await self.call("get_inference_endpoint")

    async def _request(self, url: str, path: str, left: float, headers: Mapping[str, str]) -> None:
        transport = HTTPTransport(url, backend=EndpointsBackend.name, token=self.token, headers=headers)
        try:
            await transport.request("GET", path, timeout=left)
        except BackendError as exc:
            log.debug("waking %s/%s: %s", self.namespace, self.name, exc)
        finally:
            await transport.aclose()

    async def wait_healthy(self, url: str, path: str, timeout: float, headers: Mapping[str, str]) -> None:
        """Poll the endpoint's health route (through the proxy, with the token) until it answers 200."""
        transport = HTTPTransport(url, backend=EndpointsBackend.name, token=self.token, headers=headers)
        try:
            what = f"Inference Endpoint {self.namespace}/{self.name}"
            await poll_until_ok(transport, path, timeout=timeout, interval=self.poll_interval, what=what)
        finally:
            await transport.aclose()

    async def finish(self, on_close: OnClose, quiet: bool = False) -> None:
        """Apply ``on_close``; ``quiet`` logs a failure instead of raising it (clean-up after an error)."""
        action = _ON_CLOSE[on_close]
        if action is None:
            return
        try:
            await self.call(f"{action}_inference_endpoint")
        except BackendError as exc:
            if not quiet:
                raise
            log.warning("could not %s Inference Endpoint %s/%s: %s", action, self.namespace, self.name, exc)


def _hub_error(exc: Exception, doing: str) -> BackendError | InvalidRequestError:
    """Map a huggingface_hub / httpx exception to ours (the token never appears in either)."""
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    backend = EndpointsBackend.name
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        resp = exc.response
        error = error_for_status(resp.status_code, resp.text, dict(resp.headers), backend=backend)
        error.message = f"{doing}: {error.message}"
        error.args = (error.message,)
        return error
    if isinstance(exc, LocalTokenNotFoundError):
        return AuthenticationError(
            f"{doing}: no Hugging Face token found; pass token= or set HF_TOKEN", backend=backend
        )
    if isinstance(exc, ValueError):  # huggingface_hub cannot tell the namespace, or refused an argument
        return InvalidRequestError(f"{doing}: {exc}")
    if isinstance(exc, (OSError, TimeoutError)) or type(exc).__module__.startswith("httpx"):
        return BackendUnavailableError(f"{doing}: {type(exc).__name__}: {exc}", backend=backend)
    return BackendError(f"{doing}: {type(exc).__name__}: {exc}", backend=backend)


def _detect_protocol(raw: Mapping[str, Any]) -> WireProtocol:
    image = (raw.get("model") or {}).get("image") or {}
    if not isinstance(image, Mapping):
        return "tgi"
    keys = {str(k).lower() for k in image}
    if keys & set(_OPENAI_IMAGES):
        return "openai"
    custom = image.get("custom")
    if isinstance(custom, Mapping) and any(
        word in str(custom.get("url", "")).lower() for word in _OPENAI_IMAGES
    ):
        return "openai"
    return "tgi"


def _check(
    name: object,
    create: object,
    on_close: object,
    protocol: object,
    wait_timeout: float,
    poll_interval: float,
    scale_up_timeout: float,
) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"name must be the endpoint's name (a non-empty str), got {name!r}")
    if create is not None:
        if not isinstance(create, Mapping):
            raise InvalidRequestError("create must be a mapping of create_inference_endpoint arguments")
        clash = {"name", "namespace", "token"} & set(create)
        if clash:
            raise InvalidRequestError(f"create must not hold {sorted(clash)}: pass them as backend options")
    if on_close not in _ON_CLOSE:
        raise InvalidRequestError(f"on_close must be one of {list(_ON_CLOSE)}, got {on_close!r}")
    if protocol not in (None, "tgi", "openai"):
        raise InvalidRequestError(f"protocol must be 'tgi', 'openai' or None, got {protocol!r}")
    for option, value in (
        ("wait_timeout", wait_timeout),
        ("poll_interval", poll_interval),
        ("scale_up_timeout", scale_up_timeout),
    ):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise InvalidRequestError(f"{option} must be a number > 0, got {value!r}")
