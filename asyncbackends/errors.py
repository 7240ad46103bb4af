"""The library's exceptions. Adapters map every engine or wire error to one of these at the boundary.

```
AsyncBackendsError
├── BackendNotFoundError(LookupError)     unknown name, or the adapter's extra is not installed
├── LoopError(RuntimeError)               manager stopped, blocking call from the loop thread, after fork
├── InvalidRequestError(ValueError)       rejected before sending: bad params, n>1 with greedy, empty prompt
└── BackendError                          carries .backend, .request_id, .retryable; pickles
    ├── BackendUnavailableError           connect errors, 503, an endpoint that failed or cannot resume
    ├── RateLimitedError                  429 / overloaded; .retry_after
    ├── BackendTimeoutError(TimeoutError)
    ├── RequestRejectedError              4xx other than 429 (never retried)
    │   ├── ContextLengthError            the prompt plus max_tokens exceed the model's context
    │   └── AuthenticationError           401 / 403: a missing or wrong token
    ├── BackendBrokenError                the engine died on its own (vLLM EngineDeadError)
    ├── BudgetExceededError               not sent: the run's budget could not cover its worst case
    └── BackendClosedError                used after aclose(): your code's doing
```

Every error is constructible from a message alone; everything else is a keyword argument. `retryable`
defaults to the class's `default_retryable` and decides whether `gather` retries it. Cancellation is never
wrapped: `asyncio.CancelledError` always propagates as itself.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AsyncBackendsError",
    "AuthenticationError",
    "BackendBrokenError",
    "BackendClosedError",
    "BackendError",
    "BackendNotFoundError",
    "BackendTimeoutError",
    "BackendUnavailableError",
    "BudgetExceededError",
    "ContextLengthError",
    "InvalidRequestError",
    "LoopError",
    "RateLimitedError",
    "RequestRejectedError",
]


class AsyncBackendsError(Exception):
    """Root of every exception this library raises."""


class BackendNotFoundError(AsyncBackendsError, LookupError):
    """No adapter is registered under a name, or its optional dependency is not installed."""


class LoopError(AsyncBackendsError, RuntimeError):
    """The shared loop cannot serve this call (stopped, called from its own thread, or after a fork)."""


class InvalidRequestError(AsyncBackendsError, ValueError):
    """A request or option was rejected before anything was sent."""


class BackendError(AsyncBackendsError):
    """A request failed in or on the way to a backend.

    Args:
        message: What happened, in words. Never contains a secret.
        backend: The adapter's name, for example ``"tgi"``.
        request_id: The id of the failed request, when known.
        retryable: Whether sending the same request again may succeed. ``None`` takes the class default.

    Attributes:
        default_retryable: The class's default for ``retryable``.
    """

    default_retryable: bool = True

    def __init__(
        self,
        message: str = "",
        *,
        backend: str | None = None,
        request_id: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.backend = backend
        self.request_id = request_id
        self.retryable = self.default_retryable if retryable is None else retryable

    def _state(self) -> dict[str, Any]:
        return {"backend": self.backend, "request_id": self.request_id, "retryable": self.retryable}

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments do not survive the default exception pickling; rebuild from state.
        return (_rebuild, (type(self), self.message, self._state()))

    def __str__(self) -> str:
        where = f" [{self.backend}]" if self.backend else ""
        rid = f" (request {self.request_id})" if self.request_id is not None else ""
        return f"{self.message}{where}{rid}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, backend={self.backend!r}, "
            f"request_id={self.request_id!r}, retryable={self.retryable!r})"
        )


def _rebuild(cls: type[BackendError], message: str, state: dict[str, Any]) -> BackendError:
    return cls(message, **state)


class BackendUnavailableError(BackendError):
    """The backend cannot be reached or is not serving (connection refused, 503, a failed endpoint)."""


class RateLimitedError(BackendError):
    """The backend asked us to slow down (429 or overloaded).

    Args:
        message: What happened.
        retry_after: Seconds the backend asked us to wait, when it said so.
        **kwargs: As for `BackendError`.
    """

    def __init__(self, message: str = "", *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "retry_after": self.retry_after}


class BackendTimeoutError(BackendError, TimeoutError):
    """One attempt took longer than the per-attempt timeout."""


class RequestRejectedError(BackendError):
    """The backend refused the request itself (a 4xx other than 429, a prompt too long). Never retried."""

    default_retryable = False


class ContextLengthError(RequestRejectedError):
    """The prompt plus ``max_tokens`` do not fit the model's context. Never retried.

    Raised by every adapter, whichever check caught it: vLLM's own (a prompt that leaves no room for one
    generated token), TGI's 422 input validation error, an OpenAI-compatible server's 400
    ``context_length_exceeded`` or vLLM serve's "maximum context length" wording. The integrations report
    it as a failed sample (inspect: the ``model_length`` stop reason), never as an answer.
    """


class AuthenticationError(RequestRejectedError):
    """The backend refused our credentials (401 or 403)."""


class BackendBrokenError(BackendError):
    """The backend died on its own (for example vLLM's ``EngineDeadError``). Build a new one."""

    default_retryable = False


class BudgetExceededError(BackendError):
    """Not sent: the run's `Budget` could not cover the request's worst case (``max_tokens`` included).

    Never retried within the run; the request was not sent, so a later run with a larger budget sends it
    (results the run got are in its cache, when it has one).
    """

    default_retryable = False


class BackendClosedError(BackendError):
    """The backend was used after ``aclose()``."""

    default_retryable = False
