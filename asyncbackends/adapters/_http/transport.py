"""HTTP plumbing shared by the HTTP adapters (tgi, openai, and endpoints through them).

One `HTTPTransport` per backend owns one aiohttp session, created lazily on the loop that first sends
(the shared loop, since `gather` runs there). At most ``max_connections`` exchanges run at once; the wait
for one is taken with `held_slot`, so `gather`'s per-attempt timeout does not count it. Once `aclose`
starts, every exchange ends in `BackendClosedError` and no session is opened again. A transport sends one
request and returns status, headers and body; it never retries (`gather` does). The helpers
below map HTTP statuses, ``Retry-After`` and aiohttp's exceptions onto the library's error tree, so every
HTTP adapter reports the same failure the same way. Credentials (the bearer token, any header whose name
suggests a secret, ``user:password@`` in the URL) live in `Secret` values (`credentials`), are written into
the session's default headers only, and never appear in a message, repr, log or fingerprint.
"""

from __future__ import annotations

import asyncio
import email.utils
import io
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..._clock import held_slot
from ..._field_checks import is_number
from ..._protocol import Secret
from ...errors import (
    AuthenticationError,
    BackendClosedError,
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ContextLengthError,
    InvalidRequestError,
    LoopError,
    RateLimitedError,
    RequestRejectedError,
)
from .._lengths import says_context_length
from .credentials import split_headers, split_url_credentials

__all__ = [
    "HTTPResponse",
    "HTTPTransport",
    "error_for_status",
    "is_context_length",
    "error_from_exception",
    "error_message",
    "json_body",
    "malformed_response",
    "parse_retry_after",
    "poll_until_ok",
]

# A body quoted in an error message is cut here: a proxy's HTML error page must not flood the logs.
_MAX_QUOTED = 500


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date; ``None`` if unusable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):  # NaN or infinite: ignore it
        return None
    return max(0.0, seconds)


def error_message(body: bytes | str) -> str:
    """The human part of an error body.

    TGI's ``{"error": ...}``, OpenAI's ``{"error": {"message": ...}}``, FastAPI's ``{"detail": ...}``, or
    the plain text, cut to a sane length.
    """
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    text = text.strip()
    if text.startswith("data:"):  # an error sent as a server-sent event (a streamed route's answer)
        text = text[5:].split("\n", 1)[0].strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, Mapping):
        error = data.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(data.get("message"), str):
            return str(data["message"])
        if "detail" in data:
            return str(data["detail"])
    if len(text) > _MAX_QUOTED:
        text = text[:_MAX_QUOTED] + "..."
    return text or "(empty body)"


def is_context_length(status: int, body: bytes | str) -> bool:
    """Whether a 4xx answer says the prompt plus ``max_tokens`` exceed the model's context."""
    if status not in (400, 413, 422):
        return False
    return says_context_length(body.decode("utf-8", "replace") if isinstance(body, bytes) else body)


def error_for_status(
    status: int,
    body: bytes | str,
    headers: Mapping[str, str] | None = None,
    *,
    backend: str,
    request_id: str | None = None,
) -> BackendError:
    """The library error for a non-2xx HTTP response.

    401/403 -> `AuthenticationError`; 429 -> `RateLimitedError` (``Retry-After`` honoured); a 400, 413 or
    422 that says the prompt plus ``max_tokens`` exceed the model (`is_context_length`) ->
    `ContextLengthError`; other 4xx -> `RequestRejectedError` (never retried), except 408 (a retryable
    timeout) and 424 (TGI's "failed during generation", a server-side failure); 502, 503 and 504 ->
    `BackendUnavailableError`; any other status (424, 500...) -> a retryable `BackendError`.
    """
    message = f"HTTP {status}: {error_message(body)}"
    kwargs: dict[str, Any] = {"backend": backend, "request_id": request_id}
    if status == 429:
        retry_after = parse_retry_after((headers or {}).get("Retry-After"))
        return RateLimitedError(message, retry_after=retry_after, **kwargs)
    if status in (401, 403):
        return AuthenticationError(message, **kwargs)
    if status == 408:
        return BackendTimeoutError(message, **kwargs)
    if is_context_length(status, body):
        return ContextLengthError(message, **kwargs)
    if 400 <= status < 500 and status != 424:
        return RequestRejectedError(message, **kwargs)
    if status in (502, 503, 504):
        return BackendUnavailableError(message, **kwargs)
    return BackendError(message, **kwargs)


def error_from_exception(
    exc: BaseException, *, backend: str, request_id: str | None = None, idle: float | None = None
) -> BackendError:
    """The library error for an exception aiohttp raised while sending or reading (the caller chains it).

    Timeouts -> `BackendTimeoutError` (named an idle timeout when no byte came for ``idle`` seconds);
    refused, reset or dropped connections -> `BackendUnavailableError` (both retryable); a response that
    cannot be parsed -> a retryable `BackendError`.
    """
    kwargs: dict[str, Any] = {"backend": backend, "request_id": request_id}
    detail = str(exc) or type(exc).__name__
    if idle is not None and isinstance(exc, aiohttp.SocketTimeoutError):
        return BackendTimeoutError(f"no data from the server for {idle:g} s (the idle timeout)", **kwargs)
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return BackendTimeoutError(f"HTTP request timed out ({type(exc).__name__})", **kwargs)
    if isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError)):
        return BackendUnavailableError(f"connection failed: {type(exc).__name__}: {detail}", **kwargs)
    if isinstance(exc, aiohttp.ClientPayloadError):
        return BackendUnavailableError(f"response cut short: {detail}", **kwargs)
    return BackendError(f"HTTP client error: {type(exc).__name__}: {detail}", **kwargs)


def malformed_response(
    wire: str, exc: BaseException, *, backend: str, request_id: str | None = None
) -> BackendError:
    """The error for a 2xx answer whose body is not what the wire format promises.

    Retryable: a proxy's truncated page or a server mid-restart may answer properly next time.
    """
    return BackendError(
        f"malformed {wire} response: {type(exc).__name__}: {exc}", backend=backend, request_id=request_id
    )


def json_body(resp: HTTPResponse, *, wire: str, backend: str, request_id: str | None = None) -> Any:
    """A 2xx response's body parsed as JSON.

    Raises:
        BackendError: The mapped error of a non-2xx status (`error_for_status`), or a malformed body.
    """
    if resp.status >= 300:
        raise error_for_status(resp.status, resp.body, resp.headers, backend=backend, request_id=request_id)
    try:
        return resp.json()
    except ValueError as exc:
        raise malformed_response(wire, exc, backend=backend, request_id=request_id) from exc


@dataclass(frozen=True, slots=True)
class HTTPResponse:
    """A complete HTTP response: status, headers (case-insensitive) and the raw body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


class HTTPTransport:
    """One aiohttp session for one backend: base URL, default headers, pool size, per-request timeout.

    Args:
        base_url: Scheme, host, port and optional path prefix; request paths are appended to it.
        backend: The adapter's name, for error messages.
        token: Sent as ``Authorization: Bearer ...`` when non-empty.
        headers: Extra headers sent with every request; those whose name suggests a credential
            (``Authorization``, ``X-API-Key``...) are held in `Secret` values.
        timeout: Seconds allowed for one whole request (connect, send, read); ``None`` for no limit.
        max_connections: How many HTTP exchanges may run at once (0 for unlimited). Waiting for one is
            waiting for a slot: `gather`'s per-attempt timeout does not count it.
    """

    def __init__(
        self,
        base_url: str,
        *,
        backend: str,
        token: Secret | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_connections: int = 256,
    ) -> None:
        if not isinstance(base_url, str):
            raise InvalidRequestError(f"url must be a str, got {type(base_url).__name__}")
        # user:password@ leaves the URL here: only the rest is kept, shown and fingerprinted.
        url, basic = split_url_credentials(base_url)
        if not url.startswith(("http://", "https://")):
            raise InvalidRequestError(f"url must start with http:// or https://, got {url!r}")
        if timeout is not None and not (is_number(timeout) and timeout > 0):
            raise InvalidRequestError(f"timeout must be > 0 or None, got {timeout!r}")
        if not isinstance(max_connections, int) or max_connections < 0:
            raise InvalidRequestError(f"max_connections must be an int >= 0, got {max_connections!r}")
        self.base_url = url.rstrip("/")
        self.backend = backend
        self._extra_headers, self._secret_headers = split_headers(headers)
        # One Authorization header: the one given as a header, else the URL's credentials, else the token.
        given = [
            self._secret_headers.pop(k) for k in list(self._secret_headers) if k.lower() == "authorization"
        ]
        bearer = Secret(f"Bearer {token.get_secret_value()}") if token else Secret("")
        self._auth_header = next((s for s in (*given, basic, bearer) if s), Secret(""))
        self.timeout = timeout
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None  # the pool's bound, made on the loop that first sends
        self._closed = False  # set when aclose() starts: from then on every request ends closed
        # Responses whose body is being read: aclose() ends those reads itself (see _shutdown).
        self._reading: set[aiohttp.ClientResponse] = set()

    def __repr__(self) -> str:
        return f"HTTPTransport({self.base_url!r}, backend={self.backend!r})"

    def _new_session(self) -> aiohttp.ClientSession:
        headers = {"Accept": "application/json", **self._extra_headers}
        headers.update((k, v.get_secret_value()) for k, v in self._secret_headers.items())
        if self._auth_header:
            headers["Authorization"] = self._auth_header.get_secret_value()
        # The connector is unbounded: `max_connections` is enforced by our own semaphore, taken with
        # `held_slot`, so that waiting for a connection is not timed by gather's per-attempt timeout
        # (aiohttp's own pool wait happens inside the request and would be).
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        # raise_for_status stays off: statuses are mapped by error_for_status with the body in hand.
        return aiohttp.ClientSession(
            connector=connector, headers=headers, timeout=timeout, json_serialize=_dumps, trust_env=False
        )

    @property
    def closed(self) -> bool:
        """Whether `aclose` has started."""
        return self._closed

    def closed_error(self, request_id: str | None = None) -> BackendClosedError:
        """The error of a request that meets a closed transport (not retryable: closing was the caller's)."""
        return BackendClosedError(
            f"backend {self.backend!r} was closed (aclose()) before this request finished",
            backend=self.backend,
            request_id=request_id,
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session, created on first use on the running loop; never again once `aclose` started.

        Raises:
            BackendClosedError: `aclose` has started.
            LoopError: Called from another loop than the session's.
        """
        if self._closed:
            raise self.closed_error()
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed:
            self._session = self._new_session()
            self._loop = loop
        elif loop is not self._loop:
            # An aiohttp session only works on its own loop; the fix is to go through the shared loop.
            raise LoopError(
                f"the {self.backend} backend's HTTP session lives on another event loop: call it through "
                "ab.gather / ab.run_batch or get_loop_manager().arun(...)"
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        form: aiohttp.FormData | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
        idle: float | None = None,
        pooled: bool = True,
    ) -> HTTPResponse:
        """Send one request and read the whole response; never raises for a status.

        Args:
            method: The HTTP method.
            path: Appended to the base URL.
            json_body: Sent as JSON when not ``None``.
            form: Sent as a multipart form (a file upload) when not ``None``.
            request_id: Named in errors.
            timeout: Seconds the whole exchange may take, instead of the transport's.
            idle: Seconds allowed between two reads from the socket, the wait for the answer's first byte
                included (``ab.Timeouts.idle``, read by the adapter with ``idle_timeout()``); ``None``
                for no limit. A streamed answer that keeps coming is never cut by it.
            pooled: Take one of the ``max_connections`` slots first; ``False`` for a health probe, which
                must not wait behind the answers it watches.

        Raises:
            BackendClosedError: `aclose` started before the response was read (whatever the connection did
                meanwhile: the closed pool is the cause).
            BackendTimeoutError: The request took longer than the timeout.
            BackendUnavailableError: The connection failed or dropped.
            BackendError: Anything else aiohttp raised.
        """
        kwargs: dict[str, Any] = {}
        if json_body is not None:
            # Encoded here rather than by aiohttp's json= so the compact separators are ours to choose.
            data = _dumps(json_body).encode()
            # aiohttp warns (ResourceWarning) on raw bytes over 1 MiB, as large images make; a BytesIO
            # body is streamed instead, with its length known.
            kwargs["data"] = io.BytesIO(data) if len(data) > _LARGE_BODY else data
            kwargs["headers"] = _JSON_CONTENT
        elif form is not None:
            kwargs["data"] = form
        if timeout is not None or idle is not None:
            total = timeout if timeout is not None else self.timeout
            kwargs["timeout"] = aiohttp.ClientTimeout(total=total, sock_read=idle)
        if self._closed:
            raise self.closed_error(request_id)
        session = self.session  # checks the loop before queueing on a loop-bound semaphore
        async with held_slot(self._connection_slots() if pooled else None):
            if self._closed:  # closed while this request waited for a connection
                raise self.closed_error(request_id)
            try:
                async with session.request(method, self.base_url + path, **kwargs) as resp:
                    self._reading.add(resp)
                    try:
                        body = await resp.read()
                    finally:
                        self._reading.discard(resp)
                    response = HTTPResponse(resp.status, resp.headers, body)
            except (aiohttp.ClientError, TimeoutError, ConnectionError, RuntimeError) as exc:
                if self._closed:  # the pool was closed under it: not a server failure to retry
                    raise self.closed_error(request_id) from exc
                if isinstance(exc, RuntimeError):
                    raise
                raise error_from_exception(
                    exc, backend=self.backend, request_id=request_id, idle=idle
                ) from exc
        if self._closed:
            raise self.closed_error(request_id)
        return response

    def _connection_slots(self) -> asyncio.Semaphore | None:
        """One slot per connection of the pool; ``None`` when the pool is unbounded."""
        if self.max_connections == 0:
            return None
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        return self._slots

    async def aclose(self) -> None:
        """Close the session and its pool (idempotent); requests still running end in `BackendClosedError`."""
        self._closed = True
        session, self._session = self._session, None
        if session is None or session.closed:
            return
        loop = self._loop
        if loop is None or loop is asyncio.get_running_loop() or loop.is_closed():
            await self._shutdown(session)
        else:
            # aclose() awaited from another loop: the pool belongs to the session's loop, close it there.
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._shutdown(session), loop))

    async def _shutdown(self, session: aiohttp.ClientSession) -> None:
        # aiohttp closes a connection by first forgetting its response body, so a read in progress (a
        # streamed answer still arriving) would wait forever, its read timeout dropped too: end those reads
        # here, on the session's loop, then close.
        for resp in list(self._reading):
            resp.content.set_exception(aiohttp.ClientConnectionError("the session was closed"))
        self._reading.clear()
        await session.close()


async def poll_until_ok(
    transport: HTTPTransport, path: str, *, timeout: float, interval: float, what: str
) -> None:
    """Poll ``GET path`` until it answers 200 (a server's health route), within ``timeout`` seconds.

    Args:
        transport: The transport to send with (its token and headers go along).
        path: The route to poll, for example ``/health``.
        timeout: Seconds to keep trying.
        interval: Seconds between attempts.
        what: What is being waited for, for the error message.

    Raises:
        BackendTimeoutError: No 200 within ``timeout``; the message quotes the last answer.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = "no answer yet"
    while True:
        left = deadline - loop.time()
        try:
            resp = await transport.request("GET", path, timeout=max(0.1, min(30.0, left)))
        except BackendError as exc:
            last = str(exc)
        else:
            if resp.status == 200:
                return
            last = str(error_for_status(resp.status, resp.body, resp.headers, backend=transport.backend))
        if loop.time() + interval > deadline:
            message = f"{what} not ready after {timeout} s: {last}"
            raise BackendTimeoutError(message, backend=transport.backend)
        await asyncio.sleep(interval)


_JSON_CONTENT = {"Content-Type": "application/json"}
_LARGE_BODY = 2**20  # aiohttp's TOO_LARGE_BYTES_BODY


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
