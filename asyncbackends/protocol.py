"""The `AsyncBackend` protocol every adapter satisfies, and `BaseBackend`, an optional base class.

An adapter handles exactly one request per call, like an httpx transport: it never starts a loop, never fans
out and never retries (all of that lives in `gather`). It maps its engine's errors to the library's at the
boundary with ``raise ... from exc``, and creates anything bound to an event loop lazily, on the loop that
first calls it, which `create_backend` and `gather` make the shared loop.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, ClassVar, Protocol, runtime_checkable

from .errors import BackendClosedError, RequestRejectedError
from .types import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
)

__all__ = ["AsyncBackend", "BaseBackend", "Secret"]


@runtime_checkable
class AsyncBackend(Protocol):
    """What `gather` needs from a backend.

    Attributes:
        name: The adapter's registry name, for example ``"vllm"``.
        capabilities: What it supports; decides which requests it accepts and its default concurrency.
    """

    name: str
    capabilities: Capabilities

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate ``request.params.n`` completions for one prompt.

        Raises:
            BackendError: A subclass saying what went wrong, with ``retryable`` set.
        """
        ...

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Score one continuation given its context.

        Raises:
            BackendError: A subclass saying what went wrong; `RequestRejectedError` where unsupported.
        """
        ...

    async def aclose(self) -> None:
        """Release everything the backend holds. Idempotent; any later call raises `BackendClosedError`."""
        ...


class BaseBackend:
    """An optional base for adapters: closed-state tracking and async context management.

    Subclasses set `name` and `capabilities`, implement `generate` (and `loglikelihood` when they can), call
    `_check_open()` at the start of each request, and put their clean-up in `_aclose()`.

    Example:
        ```python
        async with ab.create_backend("mock") as backend:
            result = await backend.generate(ab.GenerationRequest("hi"))
        ```
    """

    name: ClassVar[str] = "base"
    capabilities: Capabilities = Capabilities()
    _closed: bool = False

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """See `AsyncBackend.generate`."""
        raise NotImplementedError

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """See `AsyncBackend.loglikelihood`; the default refuses, for backends that cannot score."""
        self._check_open()
        raise RequestRejectedError(
            f"backend {self.name!r} does not support loglikelihood",
            backend=self.name,
            request_id=request.request_id,
        )

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Score a whole text in windows; the default refuses, for backends that cannot."""
        self._check_open()
        raise RequestRejectedError(
            f"backend {self.name!r} does not support rolling loglikelihood",
            backend=self.name,
            request_id=request.request_id,
        )

    @property
    def closed(self) -> bool:
        """Whether `aclose` has been called."""
        return self._closed

    def _check_open(self, request_id: str | None = None) -> None:
        if self._closed:
            raise BackendClosedError(
                f"backend {self.name!r} was used after aclose()", backend=self.name, request_id=request_id
            )

    async def aclose(self) -> None:
        """Release the backend's resources once; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        await self._aclose()

    async def _aclose(self) -> None:
        """Subclass hook: release resources. Called at most once."""

    def close(self) -> None:
        """Blocking `aclose`, run on the shared loop: for sync code."""
        from .loop import get_loop_manager

        get_loop_manager().run(self.aclose())

    async def __aenter__(self) -> BaseBackend:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __enter__(self) -> BaseBackend:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Secret:
    """A secret (token, API key) whose repr and str are masked, like pydantic's ``SecretStr``.

    Adapters keep credentials in one of these so not even ``repr(vars(backend))`` shows them. Call
    `get_secret_value` only where the secret goes on the wire.

    Args:
        value: The secret itself.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        """The secret itself: for request headers only."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')" if self._value else "Secret('')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> Any:
        # Pickling a secret would write it to disk in the clear (caches, multiprocessing): refuse.
        raise TypeError("Secret values cannot be pickled")
