"""Provider batch APIs as the core sees them: `SupportsBatch`, `BatchLimits`, `BatchLine`, `BatchStatus`.

A backend that can send many generation requests at once through a provider's batch API (OpenAI's Files +
Batches API, which OpenAI-compatible vendors copy) implements `SupportsBatch`; ``gather(..., batch=True)``
(`asyncbackends._batch_run`) then owns the policy: cache look-ups, splitting at `BatchLimits`, the record
of each batch in the response cache (so a killed run polls its batches instead of sending them again),
polling, progress and metrics. The backend owns the wire: one request's line, the upload, the batch's
creation, a poll, and reading the outcomes back as the library's results and errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ._types import GenerationRequest, GenerationResult
from .errors import BackendError, InvalidRequestError

__all__ = ["BatchLimits", "BatchLine", "BatchStatus", "SupportsBatch"]


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """How a backend's batches are cut and watched.

    Args:
        max_requests: Most requests in one batch (OpenAI: 50,000).
        max_bytes: Most bytes in one batch's input file (OpenAI: 200 MB).
        poll_interval: Seconds between two looks at a batch in flight.
    """

    max_requests: int = 50_000
    max_bytes: int = 200 * 1024 * 1024
    poll_interval: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidRequestError(f"batch {name} must be an int >= 1, got {value!r}")
        interval = self.poll_interval
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not 0 < interval < 1e9:
            raise InvalidRequestError(f"batch poll_interval must be a number > 0, got {interval!r}")


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request as a line of a batch's input file.

    Args:
        endpoint: The batch endpoint the line needs (one per batch: ``"/v1/chat/completions"``...).
        data: The line's bytes, without the newline.
    """

    endpoint: str
    data: bytes


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """One look at a batch.

    Args:
        id: The provider's batch id.
        status: The provider's word for its state (``"in_progress"``, ``"completed"``, ``"expired"``...).
        done: Whether it will change no more: its outcomes can be read.
        completed: Requests the provider has answered successfully so far.
        failed: Requests that failed so far.
        total: Requests in the batch, where the provider says.
        detail: The provider's own description, for the backend to read its outcomes from.
    """

    id: str
    status: str
    done: bool
    completed: int = 0
    failed: int = 0
    total: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class SupportsBatch(Protocol):
    """A backend that sends many generation requests at once through a provider's batch API.

    ``gather(backend, requests, batch=True)`` uses these members; a backend without them is refused with
    `InvalidRequestError` before anything is sent. Each method maps failures to the library's errors, as
    ``generate`` does.
    """

    batch_limits: BatchLimits

    def batch_line(self, custom_id: str, request: GenerationRequest) -> BatchLine | None:
        """``request`` as one line of an input file, answered under ``custom_id``.

        Returns:
            The line, or ``None`` for a request answered without the server (``generate`` returns it).

        Raises:
            BackendError: The request cannot be sent (a parameter refused, as ``generate`` would refuse it).
        """
        ...

    async def upload_batch_file(self, lines: Sequence[BatchLine]) -> str:
        """Upload an input file of ``lines`` (all for one endpoint); returns its file id."""
        ...

    async def create_batch(self, file_id: str, endpoint: str) -> str:
        """Start a batch over the uploaded file; returns the batch id."""
        ...

    async def find_batch(self, file_id: str) -> str | None:
        """The batch started over ``file_id``, if any (for a run killed before it recorded the batch)."""
        ...

    async def poll_batch(self, batch_id: str) -> BatchStatus:
        """The batch's state now."""
        ...

    async def batch_outcomes(
        self, status: BatchStatus, requests: Mapping[str, GenerationRequest]
    ) -> Mapping[str, GenerationResult | BackendError]:
        """The outcome of each request of a finished batch, by custom id (those it answered at all)."""
        ...

    async def cancel_batch(self, batch_id: str) -> None:
        """Ask the provider to stop the batch (what it finished stays readable)."""
        ...
