"""Refusing the optional sampling parameters a backend cannot honour, before anything is sent.

Every adapter calls `refuse_unsupported` first thing in ``generate``: a parameter set in `SamplingParams` and
not claimed in the backend's `Capabilities` is refused with `RequestRejectedError` naming it, so an
evaluation never runs with a setting silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import RequestRejectedError
from ..types import Capabilities, SamplingParams

__all__ = ["refuse_unsupported"]


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
