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
endpoint as ``on_close`` says (and does so too when building fails after the endpoint was started), within
``close_timeout`` seconds. An endpoint still open when the interpreter exits gets the same: an exit hook of
this module closes it before the shared loop stops, waiting up to ``close_timeout`` (the loop's own
shutdown gives a backend 5 s, too little for a delete).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..._loop import register_exit_hook
from ..._protocol import BaseBackend, Secret
from ..._refusals import refuse_unclaimed_chat
from ..._types import (
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
)
from ...errors import InvalidRequestError
from .._http.credentials import resolve_token
from .._reasoning_tags import check_reasoning_tags
from ..openai._backend import OpenAIBackend
from ..tgi._backend import TGIBackend
from ._lifecycle import ON_CLOSE, Lifecycle, OnClose

__all__ = ["EndpointsBackend"]

log = logging.getLogger(__name__)
WireProtocol = Literal["tgi", "openai"]
_OPENAI_IMAGES = ("vllm", "sglang", "llamacpp")
_OPENAI_TAGS = (
    "reasoning_tags split the text of a TGI endpoint; an OpenAI-protocol endpoint returns the thinking "
    "itself (reasoning_content / reasoning) when its server runs a reasoning parser "
    "(vllm serve --reasoning-parser)"
)

_OPENAI_ADAPTERS = (
    "adapters names a TGI endpoint's --lora-adapters; an OpenAI-protocol endpoint takes a request's "
    "adapter as its model (the server's LoRA modules), with no option"
)


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
        lifecycle: Lifecycle,
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
        close_timeout: float = 60.0,
        reasoning_tags: tuple[str, str] | None = None,
        adapters: Sequence[str] | str | None = None,
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
            headers: Extra headers for every request (credential-like ones, ``X-API-Key``..., held masked).
            max_connections: How many HTTP exchanges run at once; the wait for one is not timed by
            `gather`'s per-attempt timeout.
            max_concurrency: The concurrency `gather` uses when given none.
            close_timeout: Seconds the ``on_close`` action (an Endpoints API call) may take in `aclose`,
                and at interpreter exit the most the process waits for it before exiting anyway.
            reasoning_tags: ``(start, end)`` delimiting a reasoning model's thinking in the text a TGI
                endpoint returns (see `TGIBackend`); an OpenAI-protocol endpoint returns the thinking itself
                when its server has a reasoning parser (``vllm serve --reasoning-parser``): refused there.
            adapters: A TGI endpoint's LoRA adapter ids (see `TGIBackend`); ``None`` reads them from the
                endpoint's ``LORA_ADAPTERS`` environment variable (TGI's launcher reads its
                ``--lora-adapters`` from it), where set. An OpenAI-protocol endpoint takes an adapter as the
                request's ``model`` (its server's LoRA modules) and refuses this option.

        Raises:
            InvalidRequestError: An invalid option.
            RequestRejectedError: The endpoint does not exist (and ``create`` is not given).
            AuthenticationError: The token was refused.
            BackendUnavailableError: The endpoint failed (its own message is quoted).
            BackendTimeoutError: Not running and healthy within ``wait_timeout``.
        """
        _check(name, create, on_close, protocol, wait_timeout, poll_interval, scale_up_timeout, close_timeout)
        tags = check_reasoning_tags(reasoning_tags)
        if tags is not None and protocol == "openai":
            raise InvalidRequestError(_OPENAI_TAGS)
        lifecycle = Lifecycle(name, namespace, resolve_token(token), poll_interval, close_timeout)
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
                if tags is not None:  # detected from the image: refused before any request
                    raise InvalidRequestError(_OPENAI_TAGS)
                if adapters is not None:
                    raise InvalidRequestError(_OPENAI_ADAPTERS)
                inner = await OpenAIBackend.create(
                    base_url=url + "/v1", api_key=lifecycle.token, model=model, **options
                )
            else:
                inner = await TGIBackend.create(
                    url=url,
                    token=lifecycle.token,
                    reasoning_tags=tags,
                    adapters=adapters if adapters is not None else _env_adapters(raw),
                    **options,
                )
        except BaseException:
            if lifecycle.touched and on_close != "keep":
                await lifecycle.finish(on_close, quiet=True)
            raise
        backend = cls(inner, lifecycle, raw=raw, protocol=proto, on_close=on_close)
        if on_close != "keep":
            _close_at_exit[backend] = (loop, os.getpid())
        return backend

    def __repr__(self) -> str:
        where = f"{self.namespace}/{self.endpoint_name}"
        return f"EndpointsBackend({where}, url={self.url!r}, protocol={self.protocol!r})"

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What decides this backend's outputs, for the response cache (no credential in it).

        The endpoint, its repository and revision, and the model its server reports serving (TGI's
        ``/info``, an OpenAI server's model list), read before the first request.
        """
        model = self.raw.get("model") or {}
        served = {k: v for k, v in self._inner.fingerprint.items() if k not in ("name", "url", "base_url")}
        return {
            "name": self.name,
            "endpoint": f"{self.namespace}/{self.endpoint_name}",
            "repository": model.get("repository"),
            "revision": model.get("revision"),
            "protocol": self.protocol,
            "served": served,
        }

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """See `AsyncBackend.generate`; sent in the endpoint's wire format."""
        self._check_open(request.request_id)
        # Refused here as well as by the inner adapter: the endpoint answers for its capabilities.
        refuse_unclaimed_chat(request, self.capabilities, backend=self.name)
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
        _close_at_exit.pop(self, None)
        try:
            await self._inner.aclose()
        finally:
            await self._lifecycle.finish(self.on_close)


# Open backends whose on_close does something, with the loop they live on. Held strongly until closed: a
# backend dropped unclosed still owns an endpoint that costs money, and its on_close must still run at exit.
# The pid: a forked child inherits this table, but neither the loop's thread nor the duty to close.
_close_at_exit: dict[EndpointsBackend, tuple[asyncio.AbstractEventLoop, int]] = {}


def _close_open_endpoints_at_exit() -> None:
    """Apply ``on_close`` to every endpoint still open, each within its ``close_timeout``.

    Registered when this module is imported, which is after `asyncbackends._loop` registered the shared
    loop's shutdown; exit hooks run last-in first-out, so this runs while the loop still does.
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[EndpointsBackend]] = {}
    for backend, (loop, pid) in list(_close_at_exit.items()):
        if not backend.closed and pid == os.getpid() and loop.is_running():
            by_loop.setdefault(loop, []).append(backend)
    for loop, backends in by_loop.items():
        budget = max(b._lifecycle.close_timeout for b in backends) + 1.0

        async def close_all(backends: list[EndpointsBackend] = backends) -> None:
            outcomes = await asyncio.gather(*(b.aclose() for b in backends), return_exceptions=True)
            for backend, outcome in zip(backends, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    log.warning("closing %r at exit: %s", backend, outcome)

        try:
            asyncio.run_coroutine_threadsafe(close_all(), loop).result(budget)
        except Exception as exc:  # the process is exiting: report, never raise from an exit hook
            log.warning("closing Inference Endpoints at exit: %s: %s", type(exc).__name__, exc)


register_exit_hook(_close_open_endpoints_at_exit)


def _env_adapters(raw: Mapping[str, Any]) -> str | None:
    """The endpoint's ``LORA_ADAPTERS`` (its TGI's ``--lora-adapters``), where its description sets it."""
    env = (raw.get("model") or {}).get("env") or {}
    value = env.get("LORA_ADAPTERS") if isinstance(env, Mapping) else None
    return value if isinstance(value, str) and value.strip() else None


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
    close_timeout: float,
) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"name must be the endpoint's name (a non-empty str), got {name!r}")
    if create is not None:
        if not isinstance(create, Mapping):
            raise InvalidRequestError("create must be a mapping of create_inference_endpoint arguments")
        clash = {"name", "namespace", "token"} & set(create)
        if clash:
            raise InvalidRequestError(f"create must not hold {sorted(clash)}: pass them as backend options")
    if on_close not in ON_CLOSE:
        raise InvalidRequestError(f"on_close must be one of {list(ON_CLOSE)}, got {on_close!r}")
    if protocol not in (None, "tgi", "openai"):
        raise InvalidRequestError(f"protocol must be 'tgi', 'openai' or None, got {protocol!r}")
    for option, value in (
        ("wait_timeout", wait_timeout),
        ("poll_interval", poll_interval),
        ("scale_up_timeout", scale_up_timeout),
        ("close_timeout", close_timeout),
    ):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise InvalidRequestError(f"{option} must be a number > 0, got {value!r}")
