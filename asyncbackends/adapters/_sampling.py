"""Refusing what a backend cannot honour, before anything is sent.

Every adapter calls `refuse_unsupported` first thing in ``generate``: a parameter set in `SamplingParams` and
not claimed in the backend's `Capabilities` is refused with `RequestRejectedError` naming it, so an
evaluation never runs with a setting silently dropped. `refuse_unclaimed_chat` does the same for images and
tools in a chat request.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import RequestRejectedError
from ..types import Capabilities, GenerationRequest, SamplingParams

__all__ = ["refuse_unclaimed_chat", "refuse_unsupported"]


def refuse_unsupported(
    params: SamplingParams,
    capabilities: Capabilities,
    *,
    backend: str,
    request_id: str | None,
    reasons: Mapping[str, str] | None = None,
) -> None:
    """Raise `RequestRejectedError` naming every optional parameter ``params`` sets that is not honoured.

    Args:
        params: The request's sampling parameters.
        capabilities: What the backend honours.
        backend: The backend's name, for the error.
        request_id: The request's id, for the error.
        reasons: Why a parameter is not honoured, by name, added to the message where given.
    """
    refused = capabilities.unsupported(params)
    if not refused:
        return
    why = "; ".join(f"{name}: {(reasons or {})[name]}" for name in refused if name in (reasons or {}))
    raise RequestRejectedError(
        f"{backend} cannot honour {', '.join(refused)} (its capabilities say so)"
        + (f": {why}" if why else "")
        + "; leave them None, or use a backend that honours them",
        backend=backend,
        request_id=request_id,
    )


def refuse_unclaimed_chat(
    request: GenerationRequest,
    capabilities: Capabilities,
    *,
    backend: str,
    reasons: Mapping[str, str] | None = None,
) -> None:
    """Raise `RequestRejectedError` if ``request`` holds images or tools that ``capabilities`` do not claim.

    Tools count when the request offers any or its messages hold tool calls or tool results (a backend
    without tools could not render them faithfully).

    Args:
        request: The request about to be sent.
        capabilities: What the backend accepts (``images``, ``tools``).
        backend: The backend's name, for the error.
        reasons: Why ``"images"`` or ``"tools"`` is not accepted, added to the message where given.
    """
    refused = []
    if not capabilities.images and request.images:
        refused.append("images")
    if not capabilities.tools and request.uses_tools:
        refused.append("tools")
    if not refused:
        return
    why = "; ".join(f"{name}: {(reasons or {})[name]}" for name in refused if name in (reasons or {}))
    raise RequestRejectedError(
        f"{backend} does not accept {' or '.join(refused)} (its capabilities say so)"
        + (f": {why}" if why else "")
        + "; send a text-only request, or use a backend that accepts them",
        backend=backend,
        request_id=request.request_id,
    )
