"""`Capabilities`: what a backend can do, and `refuse_unsupported`, which refuses what it cannot.

Every adapter calls `refuse_unsupported` first thing in ``generate``: a parameter set in `SamplingParams` and
not claimed in the backend's `Capabilities` is refused with `RequestRejectedError` naming it, so an
evaluation never runs with a setting silently dropped. `refuse_unclaimed_chat` does the same for images and
tools in a chat request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from ._sampling_params import OPTIONAL_SAMPLING_PARAMS, SamplingParams
from .errors import RequestRejectedError

if TYPE_CHECKING:  # _types imports this module
    from ._types import GenerationRequest

__all__ = ["Capabilities", "refuse_unclaimed_chat", "refuse_unsupported"]


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
        images: Accepts image content parts in chat messages.
        tools: Accepts tools and tool choice, and returns tool calls.
        reasoning: Returns a reasoning model's thinking apart from its answer (`Completion.reasoning`).
        reasoning_effort: Honours ``SamplingParams.reasoning_effort``.
        thinking_budget: Enforces ``SamplingParams.thinking_budget``.

    A backend refuses a request that sets an optional sampling parameter whose flag is false, or that holds
    images or tools it does not claim, with `RequestRejectedError` naming it, before sending anything
    (`unsupported` lists the parameters).
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
    images: bool = False
    tools: bool = False
    reasoning: bool = False
    reasoning_effort: bool = False
    thinking_budget: bool = False

    def unsupported(self, params: SamplingParams) -> tuple[str, ...]:
        """The optional parameters ``params`` sets that this backend does not honour (empty if none)."""
        # One pass over the names, no dict of the set values: every adapter calls this once per request.
        return tuple(
            name
            for name in OPTIONAL_SAMPLING_PARAMS
            if getattr(params, name) is not None and not getattr(self, name)
        )


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
