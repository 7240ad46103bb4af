"""What every wrapper backend shares: sending through the wrapped backend, and looking like it.

A wrapper (`ab.limited`, `ab.with_adapter`) is itself a backend, so every feature works through it: its
name, capabilities, prices and side doors (tokenizer, context length, ``/info``, readiness) are the
wrapped backend's, and `aclose` closes the wrapped backend. What a wrapper adds is one hook,
`ForwardingBackend._send`, that every request method passes through. ``loglikelihood_rolling`` exists on
the wrapper only where the wrapped backend has it (`ForwardingRolling`), so `SupportsRollingLoglikelihood`
answers for the wrapper as for the backend.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .._protocol import AsyncBackend, Closing, SupportsRollingLoglikelihood
from .._side_doors import FORWARDED
from .._types import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
)
from .._usage import Pricing, pricing_of

__all__ = ["ForwardingBackend", "ForwardingRolling", "Send"]

T = TypeVar("T")
Send = Callable[[Any], Coroutine[Any, Any, T]]
"""One of the wrapped backend's request methods."""


class ForwardingBackend(Closing):
    """A backend that sends every request through ``backend``, by way of `_send`.

    Attributes:
        backend: The wrapped backend.
    """

    def __init__(self, backend: AsyncBackend) -> None:
        self.backend = backend
        self.name: str = backend.name
        self.capabilities: Capabilities = backend.capabilities
        # The side doors as instance attributes: `isinstance` with their protocols (`asyncbackends.abc`)
        # then answers for the wrapper as for the backend (it reads no property or __getattr__).
        for side_door in FORWARDED:
            if hasattr(backend, side_door):
                setattr(self, side_door, getattr(backend, side_door))

    @property
    def pricing(self) -> Pricing | None:
        """The wrapped backend's prices (`Pricing`), where it has them: a wrapper does not change them."""
        return pricing_of(self.backend)

    async def _send(self, request: Any, send: Send[T]) -> T:
        """Send ``request`` with ``send`` (a method of the wrapped backend): what a wrapper changes."""
        return await send(request)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """`AsyncBackend.generate`, through the wrapper."""
        return await self._send(request, self.backend.generate)

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """`AsyncBackend.loglikelihood`, through the wrapper."""
        return await self._send(request, self.backend.loglikelihood)

    async def aclose(self) -> None:
        """Close the wrapped backend."""
        await self.backend.aclose()


class ForwardingRolling(ForwardingBackend):
    """A `ForwardingBackend` around a backend that has ``loglikelihood_rolling``."""

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """``loglikelihood_rolling`` of the wrapped backend, through the wrapper."""
        backend = self.backend
        assert isinstance(backend, SupportsRollingLoglikelihood)
        return await self._send(request, backend.loglikelihood_rolling)
