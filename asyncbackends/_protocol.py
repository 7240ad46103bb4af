"""The `AsyncBackend` protocol, the optional capabilities the core calls, and `BaseBackend`.

An adapter handles one request per call and never retries: bounded concurrency, retries, timeouts and rate
limits all live in `gather`. Where one request needs several engine calls (``n > 1`` samples on a server
without native ``n``, the windows of a rolling loglikelihood) the adapter fans out inside that one call,
through `asyncbackends._tasks.all_or_nothing`, so the parts succeed or fail as one. It maps its engine's
errors to the library's at the boundary with ``raise ... from exc``, and creates anything bound to an event
loop lazily, on the loop that first calls it, which `create_backend` and `gather` make the shared loop.

What the core calls beyond `AsyncBackend` is declared here as small protocols, each optional:
`SupportsRollingLoglikelihood` (``loglikelihood_rolling``) and `SupportsFingerprint` (``fingerprint``, the
cache key). `backend_method` is the one table from a request type to the backend method that serves it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, ClassVar, Final, Protocol, Self, runtime_checkable

from ._types import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Request,
    Result,
    RollingLoglikelihoodRequest,
)
from ._usage import Pricing
from .errors import BackendClosedError, RequestRejectedError

__all__ = [
    "REQUEST_METHODS",
    "AsyncBackend",
    "BaseBackend",
    "Closing",
    "Secret",
    "SupportsFingerprint",
    "SupportsRollingLoglikelihood",
    "backend_method",
]


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


@runtime_checkable
class SupportsRollingLoglikelihood(Protocol):
    """A backend that scores whole texts (perplexity tasks): `gather` sends it rolling requests."""

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Score ``request.text`` in windows of the model's length, summed.

        Raises:
            BackendError: A subclass saying what went wrong; `RequestRejectedError` where unsupported.
        """
        ...


@runtime_checkable
class SupportsFingerprint(Protocol):
    """A backend that says what decides its outputs, for the response cache's key.

    ``fingerprint`` is a JSON-able mapping with no secret in it (adapter, model, the options that change
    outputs); two backends with equal fingerprints must give equal results for equal requests. ``None``
    means "unknown": the cache then keys by the backend's name alone.
    """

    @property
    def fingerprint(self) -> Mapping[str, Any] | None:
        """What decides this backend's outputs."""
        ...


BackendMethod = Callable[[Any], Awaitable[Result]]


def _rolling(backend: AsyncBackend) -> BackendMethod | None:
    return backend.loglikelihood_rolling if isinstance(backend, SupportsRollingLoglikelihood) else None


_DISPATCH: Final[Mapping[type, tuple[str, Callable[[AsyncBackend], BackendMethod | None]]]] = (
    MappingProxyType(
        {
            GenerationRequest: ("generate", lambda backend: backend.generate),
            LoglikelihoodRequest: ("loglikelihood", lambda backend: backend.loglikelihood),
            RollingLoglikelihoodRequest: ("loglikelihood_rolling", _rolling),
        }
    )
)

REQUEST_METHODS: Final[Mapping[type, str]] = MappingProxyType({t: name for t, (name, _) in _DISPATCH.items()})
"""The backend method's name for each request type."""


def backend_method(backend: AsyncBackend, request_type: type[Request]) -> BackendMethod | None:
    """The bound method of ``backend`` that serves requests of ``request_type``.

    Returns:
        The method, or ``None`` when ``request_type`` is not a request type or the backend lacks the
        (optional) method.
    """
    # By the nearest request type in the MRO: a private subclass (the lm-eval integration's
    # `_text.EncodePairRequest`) is served as the request it extends.
    entry = next((_DISPATCH[t] for t in request_type.__mro__ if t in _DISPATCH), None)
    return None if entry is None else entry[1](backend)


class Closing:
    """``close()`` and both context-manager forms, built on the class's own ``aclose()``.

    Shared by `BaseBackend` and the wrappers that are backends without being `BaseBackend` subclasses
    (``ab.limited``), so every backend the library hands out closes the same way from sync and async code.
    """

    async def aclose(self) -> None:
        """Release the backend's resources (the subclass says how)."""
        raise NotImplementedError

    def close(self) -> None:
        """Blocking `aclose`, run on the shared loop: for sync code."""
        from ._loop import get_loop_manager

        get_loop_manager().run(self.aclose())

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class BaseBackend(Closing):
    """An optional base for adapters: closed-state tracking and async context management.

    Subclasses set `name` and `capabilities`, implement `generate` (and `loglikelihood` when they can), call
    `_check_open()` at the start of each request, and put their clean-up in `_aclose()`. A `BaseBackend` is
    an async (and a sync) context manager that closes it; for any other backend use
    ``contextlib.aclosing(backend)``.

    Example:
        ```python
        import asyncbackends as ab


        class Echo(ab.BaseBackend):
            name = "echo"

            async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
                self._check_open(request.request_id)
                return ab.GenerationResult(request.request_id, (ab.Completion(str(request.prompt)),))


        async def main() -> str:
            async with Echo() as backend:
                result = await backend.generate(ab.GenerationRequest("hi"))
            return result.text
        ```
    """

    name: ClassVar[str] = "base"
    capabilities: Capabilities = Capabilities()
    pricing: Pricing | None = None
    """The prices runs through this backend are charged at (`RunMetrics.cost`, cost budgets); ``None``."""
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
