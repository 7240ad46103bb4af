"""What the ``tgi`` adapter refuses: what TGI's router would reject, in our words, and unscorable answers.

TGI answers some requests it cannot serve from its base model or with an error only a server log explains
(token-id prompts, ``max_new_tokens=0``, negative seeds, a chat ``top_k``); these checks refuse them here,
naming the field, before any HTTP exchange.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._refusals import refuse_unclaimed_chat, refuse_unsupported
from ..._sampling_params import SamplingParams
from ..._types import Capabilities, GenerationRequest
from ...errors import InvalidRequestError, RequestRejectedError
from .._http.transport import malformed_response
from ._wire import NOT_ON_CHAT, UNSUPPORTED_REASONS, TGIInfo, parse_lora_adapters

__all__ = ["check_adapters", "continuation_logprobs", "refuse_for_info", "refuse_generation"]


def refuse_generation(request: GenerationRequest, capabilities: Capabilities, *, backend: str) -> None:
    """Refuse a generation TGI cannot serve as asked, whatever the server (``/info`` is not needed).

    Raises:
        RequestRejectedError: A token-id prompt, or a field TGI's chat route has no place for.
        InvalidRequestError: ``max_tokens=0``, a negative seed, or a chat prompt's ``top_k``.
        UnsupportedFeatureError: A sampling field TGI has no equivalent for.
    """
    rid = request.request_id
    params = request.params
    kind = request.prompt_kind
    refuse_unsupported(params, capabilities, backend=backend, request_id=rid, reasons=UNSUPPORTED_REASONS)
    refuse_unclaimed_chat(request, capabilities, backend=backend)
    on_generate_only = [n for n in NOT_ON_CHAT if getattr(params, n) is not None]
    if kind == "chat" and on_generate_only:
        raise RequestRejectedError(
            f"TGI's chat route has no {', '.join(on_generate_only)}; use a text prompt for it",
            backend=backend,
            request_id=rid,
        )
    if kind == "tokens":
        raise RequestRejectedError(
            "TGI takes text or chat prompts, not token ids", backend=backend, request_id=rid
        )
    if params.max_tokens == 0:
        raise InvalidRequestError("TGI rejects max_new_tokens=0: ask for at least one token")
    if params.seed is not None and params.seed < 0:
        raise InvalidRequestError(f"TGI seeds are unsigned 64-bit integers, got {params.seed}")
    if kind == "chat" and params.top_k is not None:
        raise InvalidRequestError("TGI's chat route has no top_k; leave it None for chat prompts")


def refuse_for_info(params: SamplingParams, info: TGIInfo) -> None:
    """Refuse what this server's ``/info`` says it rejects (more stop sequences than it takes).

    Raises:
        InvalidRequestError: Too many stop sequences.
    """
    if info.max_stop_sequences is not None and len(params.stop) > info.max_stop_sequences:
        raise InvalidRequestError(
            f"this server accepts at most {info.max_stop_sequences} stop sequences, got {len(params.stop)}"
        )


def check_adapters(adapters: Sequence[str] | str | None) -> tuple[str, ...] | None:
    """The ``adapters`` option as a tuple of ids (a ``--lora-adapters`` string parsed as TGI parses it).

    Raises:
        InvalidRequestError: Not one adapter id or more.
    """
    if adapters is None:
        return None
    try:
        ids = parse_lora_adapters(adapters) if isinstance(adapters, str) else tuple(adapters)
    except ValueError as exc:
        raise InvalidRequestError(f"adapters: {exc}") from exc
    if not ids or not all(isinstance(i, str) and i and i == i.strip() for i in ids):
        raise InvalidRequestError(f"adapters must name one adapter id or more (non-empty strs) {adapters!r}")
    return ids


def continuation_logprobs(body: Any, k: int, *, backend: str, request_id: str | None) -> tuple[float, ...]:
    """The last ``k`` prefill logprobs of a ``/generate`` answer with ``decoder_input_details``.

    Raises:
        RequestRejectedError: The continuation has no tokens, or one of them has no logprob (the prompt's
            first token, when the model adds no BOS).
        BackendError: The answer is not TGI's (retryable, as every malformed answer is).
    """
    try:
        prefill = body["details"]["prefill"]
        logprobs = [t["logprob"] for t in prefill[len(prefill) - k :]] if k > 0 else []
    except (KeyError, TypeError) as exc:
        raise malformed_response("TGI", exc, backend=backend, request_id=request_id) from exc
    if k <= 0 or len(prefill) < k or any(lp is None for lp in logprobs):
        raise RequestRejectedError(
            f"cannot score this continuation: {k} continuation token(s), {len(prefill)} prefill token(s) "
            "(the first input token has no logprob: give a context, or a model that adds BOS)",
            backend=backend,
            request_id=request_id,
        )
    return tuple(float(lp) for lp in logprobs)
