"""`Capabilities`: what a backend can do, and `refuse_unsupported`, which refuses what it cannot.

Every adapter calls `refuse_unsupported` first thing in ``generate``: a parameter set in `SamplingParams` and
not claimed in the backend's `Capabilities` is refused with `RequestRejectedError` naming it, so an
evaluation never runs with a setting silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ._sampling_params import SamplingParams
from .errors import RequestRejectedError

__all__ = ["Capabilities", "refuse_unsupported"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do. Every field defaults to "cannot" so ``Capabilities()`` is valid.

    Args:
        loglikelihood: Implements `loglikelihood`.
        rolling_loglikelihood: Implements ``loglikelihood_rolling`` (perplexity tasks).
        is_greedy: Loglikelihood results say whether the continuation is greedy.
        n_samples: Returns ``n`` completions for one request (natively or by fanning out).
        seed: Honours ``SamplingParams.seed`` reproducibly.
        chat: Accepts chat-message prompts.
        token_ids: Accepts token-id prompts and reports generated token ids.
        logprobs: Can return per-token logprobs of generated tokens.
        stop: Honours stop strings.
        max_concurrency: The concurrency `gather` uses when the caller gives none; ``None`` for the default.
        repetition_penalty: Honours ``SamplingParams.repetition_penalty``.
        presence_penalty: Honours ``SamplingParams.presence_penalty``.
        frequency_penalty: Honours ``SamplingParams.frequency_penalty``.
        min_p: Honours ``SamplingParams.min_p``.
        min_tokens: Honours ``SamplingParams.min_tokens``.
        json_schema: Constrains outputs to ``SamplingParams.json_schema``.
        regex: Constrains outputs to ``SamplingParams.regex``.

    A backend refuses a request that sets an optional sampling parameter whose flag is false with
    `RequestRejectedError` naming it, before sending anything (`unsupported` lists them).
    """

    loglikelihood: bool = False
    rolling_loglikelihood: bool = False
    is_greedy: bool = False
    n_samples: bool = False
    seed: bool = False
    chat: bool = False
    token_ids: bool = False
    logprobs: bool = False
    stop: bool = False
    max_concurrency: int | None = None
    repetition_penalty: bool = False
    presence_penalty: bool = False
    frequency_penalty: bool = False
    min_p: bool = False
    min_tokens: bool = False
    json_schema: bool = False
    regex: bool = False

    def unsupported(self, params: SamplingParams) -> tuple[str, ...]:
        """The optional parameters ``params`` sets that this backend does not honour (empty if none)."""
        return tuple(name for name in params.optional_params() if not getattr(self, name))


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
