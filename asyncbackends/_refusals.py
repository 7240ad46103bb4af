"""Refusing before sending what a backend's `Capabilities` do not claim: one message for every adapter.

Apart from `Capabilities` itself, which the request types name: a request type may say what it needs without
the refusals, which name the request type, importing back.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NoReturn

from ._capabilities import Capabilities
from ._sampling_params import SamplingParams
from ._types import GenerationRequest, Request
from .errors import RequestRejectedError

__all__ = [
    "refuse_unclaimed_adapter",
    "refuse_unclaimed_chat",
    "refuse_unknown_adapter",
    "refuse_unsupported",
]


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


def refuse_unclaimed_adapter(request: Request, capabilities: Capabilities, *, backend: str) -> None:
    """Raise `RequestRejectedError` if ``request`` names an adapter and ``capabilities`` claim none.

    `gather` checks this for every backend before the first attempt, so an adapter that does not know the
    field never answers from its base model a request that named an adapter; adapters that serve adapters
    check the name itself (`refuse_unknown_adapter`).

    Args:
        request: The request about to be sent.
        capabilities: What the backend serves.
        backend: The backend's name, for the error.
    """
    if request.adapter is not None and not capabilities.adapters:
        _refuse(
            f"{backend} serves no LoRA adapters, and the request names adapter {request.adapter!r}",
            ["adapters"],
            None,
            "leave adapter None (the base model), or use a backend that serves adapters "
            "(the vllm adapter's lora_modules, a server's LoRA modules, TGI's adapter_id)",
            backend=backend,
            request_id=request.request_id,
        )


def refuse_unknown_adapter(
    request: Request, known: Collection[str], *, backend: str, how: str = "lora_modules"
) -> None:
    """Raise `RequestRejectedError` if ``request`` names an adapter outside ``known``, naming the known ones.

    Args:
        request: The request about to be sent.
        known: The adapter names the backend serves.
        backend: The backend's name, for the error.
        how: Where the backend's adapters are named, for the hint (an option's name).
    """
    if request.adapter is not None and request.adapter not in known:
        names = ", ".join(repr(name) for name in sorted(known)) or "none"
        raise RequestRejectedError(
            f"{backend} has no adapter {request.adapter!r}; it serves {names} (its {how})",
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
