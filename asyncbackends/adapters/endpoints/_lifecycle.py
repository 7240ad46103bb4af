"""The Inference Endpoints lifecycle behind the ``endpoints`` adapter: huggingface_hub calls in threads.

`Lifecycle` finds, creates, resumes, wakes and waits for one endpoint, and applies ``on_close`` within
``close_timeout``; `in_thread` runs each blocking huggingface_hub call in a daemon thread of its own (so the
calls still run at interpreter exit); `hub_error` maps huggingface_hub's exceptions onto the library's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from ..._protocol import Secret
from ...errors import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    InvalidRequestError,
    RequestRejectedError,
)
from .._http.transport import HTTPTransport, error_for_status, poll_until_ok

__all__ = ["BACKEND", "ON_CLOSE", "OnClose", "in_thread"]

log = logging.getLogger("asyncbackends.adapters.endpoints")
T = TypeVar("T")
BACKEND = "endpoints"
OnClose = Literal["keep", "pause", "scale_to_zero", "delete"]
ON_CLOSE = {"keep": None, "pause": "pause", "scale_to_zero": "scale_to_zero", "delete": "delete"}


class Lifecycle:
    """huggingface_hub's Inference Endpoints calls for one endpoint, each in a worker thread."""

    def __init__(
        self, name: str, namespace: str | None, token: Secret, poll_interval: float, close_timeout: float
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.token = token
        self.poll_interval = poll_interval
        self.close_timeout = close_timeout
        self.touched = False  # whether we created, resumed or woke it (on_close then applies on failure)

    def __repr__(self) -> str:
        return f"Lifecycle({self.namespace}/{self.name})"

    async def call(self, method: str, **kwargs: Any) -> Mapping[str, Any]:
        """Run ``HfApi().<method>(name, namespace=..., token=...)`` in a thread; the endpoint's raw JSON."""
        from huggingface_hub import HfApi

        token = self.token.get_secret_value() or False
        fn = functools.partial(
            getattr(HfApi(), method), self.name, namespace=self.namespace, token=token, **kwargs
        )
        try:
            endpoint = await in_thread(fn)
        except Exception as exc:
            raise hub_error(exc, f"{method} {self.namespace or '(your namespace)'}/{self.name}") from exc
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
                    backend=BACKEND,
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
                    backend=BACKEND,
                )
            else:
                await asyncio.sleep(min(self.poll_interval, left))
            raw = await self.call("get_inference_endpoint")

    async def _request(self, url: str, path: str, left: float, headers: Mapping[str, str]) -> None:
        transport = HTTPTransport(url, backend=BACKEND, token=self.token, headers=headers)
        try:
            await transport.request("GET", path, timeout=left)
        except BackendError as exc:
            log.debug("waking %s/%s: %s", self.namespace, self.name, exc)
        finally:
            await transport.aclose()

    async def wait_healthy(self, url: str, path: str, timeout: float, headers: Mapping[str, str]) -> None:
        """Poll the endpoint's health route (through the proxy, with the token) until it answers 200."""
        transport = HTTPTransport(url, backend=BACKEND, token=self.token, headers=headers)
        try:
            what = f"Inference Endpoint {self.namespace}/{self.name}"
            await poll_until_ok(transport, path, timeout=timeout, interval=self.poll_interval, what=what)
        finally:
            await transport.aclose()

    async def finish(self, on_close: OnClose, quiet: bool = False) -> None:
        """Apply ``on_close``; ``quiet`` logs a failure instead of raising it (clean-up after an error)."""
        action = ON_CLOSE[on_close]
        if action is None:
            return
        try:
            async with asyncio.timeout(self.close_timeout):
                await self.call(f"{action}_inference_endpoint")
        except TimeoutError:
            error = BackendTimeoutError(
                f"could not {action} Inference Endpoint {self.namespace}/{self.name} within close_timeout="
                f"{self.close_timeout} s (the call goes on in the background while the process lives)",
                backend=BACKEND,
            )
            if not quiet:
                raise error from None
            log.warning("%s", error)
        except BackendError as exc:
            if not quiet:
                raise
            log.warning("could not %s Inference Endpoint %s/%s: %s", action, self.namespace, self.name, exc)


async def in_thread(fn: Callable[[], T]) -> T:
    """Run a blocking call in a daemon thread of its own and await its result.

    Not the loop's default executor (``asyncio.to_thread``): at interpreter exit that executor refuses new
    work (its own exit hook runs before any ``atexit`` one), and an ``on_close`` action must run then too.
    A daemon thread, so a call that outlives its ``close_timeout`` cannot hold the process open.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # the caller gave up (timeout, cancellation)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = fn()
        except BaseException as exc:  # handed to the awaiting task, which maps it
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=target, name="asyncbackends-endpoints-api", daemon=True).start()
    return await future


def hub_error(exc: Exception, doing: str) -> BackendError | InvalidRequestError:
    """Map a huggingface_hub / httpx exception to ours (the token never appears in either)."""
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    backend = BACKEND
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
