"""`Capabilities`: what a backend can do.

Every adapter refuses what its capabilities do not claim before sending (`asyncbackends._refusals`): a
parameter set in `SamplingParams` and not claimed is refused with `RequestRejectedError` naming it, so an
evaluation never runs with a setting silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._sampling_params import OPTIONAL_SAMPLING_PARAMS, SamplingParams

__all__ = ["Capabilities"]


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
        adapters: Serves LoRA adapters named per request (``GenerationRequest.adapter`` and the
            loglikelihood requests' ``adapter``).

    A backend refuses a request that sets an optional sampling parameter whose flag is false, or that holds
    images or tools it does not claim, or that names an adapter without ``adapters``, with
    `RequestRejectedError` naming it, before sending anything (`unsupported` lists the parameters).
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
    adapters: bool = False

    def unsupported(self, params: SamplingParams) -> tuple[str, ...]:
        """The optional parameters ``params`` sets that this backend does not honour (empty if none)."""
        # One pass over the names, no dict of the set values: every adapter calls this once per request.
        return tuple(
            name
            for name in OPTIONAL_SAMPLING_PARAMS
            if getattr(params, name) is not None and not getattr(self, name)
        )
