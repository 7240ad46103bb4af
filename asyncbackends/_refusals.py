"""Refusing before sending what a backend's `Capabilities` do not claim: one message for every adapter.

Apart from `Capabilities` itself, which the request types name: a request type may say what it needs without
the refusals, which name the request type, importing back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NoReturn

from ._capabilities import Capabilities
from ._sampling_params import SamplingParams
from ._types import GenerationRequest
from .errors import RequestRejectedError

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
    if refused:
        _refuse(
            f"{backend} cannot honour {', '.join(refused)}",
            refused,
            reasons,
            "leave them None, or use a backend that honours them",
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
    if refused:
        _refuse(
            f"{backend} does not accept {' or '.join(refused)}",
            refused,
            reasons,
            "send a text-only request, or use a backend that accepts them",
            backend=backend,
            request_id=request.request_id,
        )


def _refuse(
    head: str,
    refused: Sequence[str],
    reasons: Mapping[str, str] | None,
    hint: str,
    *,
    backend: str,
    request_id: str | None,
) -> NoReturn:
    """Raise the one refusal message both checks give: what, why (where a reason is known), what to do."""
    why = "; ".join(f"{name}: {(reasons or {})[name]}" for name in refused if name in (reasons or {}))
    raise RequestRejectedError(
        f"{head} (its capabilities say so)" + (f": {why}" if why else "") + f"; {hint}",
        backend=backend,
        request_id=request_id,
    )
