"""How the ``vllm`` adapter translates requests and results to and from vLLM's own types.

Our requests become prompt token ids (encoded here, not by vLLM) and a vLLM ``SamplingParams`` asking for
``FINAL_ONLY`` output; vLLM's ``RequestOutput`` becomes our completions; the adapter's `capabilities` claim
what is translated here. Imported by `import_vllm` once vLLM is, like `_engine_lifecycle`: the adapter's own
module imports no vLLM.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from ..._sampling_table import OPTIONAL_SPECS
from ..._types import Capabilities, Completion, GenerationRequest, SamplingParams
from ...errors import InvalidRequestError
from .._scoring import logprob_of
from ._compat import VLLMError

with warnings.catch_warnings():  # import-time DeprecationWarnings from vLLM and torch, as in vllm.py
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm import TokensPrompt
    from vllm.outputs import RequestOutput
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
    from vllm.v1.engine.async_llm import AsyncLLM

__all__ = [
    "completions",
    "engine_capabilities",
    "engine_input",
    "prompt_ids",
    "vllm_sampling",
]


# The optional parameters vLLM takes as a field (the table's vllm names), by our name; the thinking budget is
# claimed apart, only where the engine enforces it.
_FIELDS = {spec.name: spec.vllm for spec in OPTIONAL_SPECS if spec.vllm}
_PLAIN = tuple(name for name in _FIELDS if name != "thinking_budget")


def engine_capabilities(
    *, images: bool, max_concurrency: int, reasoning: bool = False, engine: Any = None, adapters: bool = False
) -> Capabilities:
    """What the adapter claims: every field `vllm_sampling` translates, images only on a multimodal model.

    Args:
        images: Whether vLLM loads the model as multimodal.
        max_concurrency: The concurrency hint for `gather`.
        reasoning: Whether the engine was built with a reasoning parser (the adapter splits its outputs).
        engine: The ``AsyncLLM``: with a reasoning parser, a thinking budget is claimed where this vLLM has
            ``thinking_token_budget`` and the engine its ``reasoning_config``.
        adapters: Whether the backend serves LoRA adapters (``lora_modules``, `_lora`).
    """
    config = getattr(getattr(engine, "vllm_config", None), "reasoning_config", None) if reasoning else None
    return Capabilities(
        reasoning=reasoning,
        thinking_budget=config is not None
        and "thinking_token_budget" in VLLMSamplingParams.__struct_fields__,
        loglikelihood=True,
        rolling_loglikelihood=True,
        is_greedy=True,
        n_samples=True,
        seed=True,
        chat=True,
        images=images,
        tools=True,
        token_ids=True,
        logprobs=True,
        stop=True,
        max_concurrency=max_concurrency,
        **dict.fromkeys(_PLAIN, True),
        json_schema=True,
        regex=True,
        adapters=adapters,
    )


def vllm_sampling(params: SamplingParams) -> VLLMSamplingParams:
    """Our sampling parameters as vLLM's, asking for the final output only; equal ones share one object.

    Sharing is safe: vLLM copies a request's parameters before it changes them (its offline ``generate``
    hands one object to every prompt). It saves five objects per request that would otherwise live as long
    as the request and be promoted to the collector's oldest generation (see docs/benchmarks.md).

    Raises:
        InvalidRequestError: vLLM refuses them.
    """
    if params.json_schema is not None:  # a dict: the caller may change it in place, so never reuse
        return _converted(params)
    return _shared(params)


def _converted(params: SamplingParams) -> VLLMSamplingParams:
    # The optional parameters are vLLM's fields of the table's names; unset ones are left out so vLLM's own
    # defaults apply. Structured output is vLLM's StructuredOutputsParams (whitespace inside JSON is the
    # engine's structured_outputs_config, not a per-request setting, in vLLM 0.32). A thinking budget is
    # claimed only where the engine enforces it (engine_capabilities).
    set_values = params.optional_params()
    optional = {_FIELDS[name]: value for name, value in set_values.items() if name in _FIELDS}
    schema, regex = set_values.get("json_schema"), set_values.get("regex")
    try:
        if schema is not None or regex is not None:
            optional["structured_outputs"] = StructuredOutputsParams(json=schema, regex=regex)
        return VLLMSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or 0,
            stop=list(params.stop) or None,
            max_tokens=params.max_tokens,
            seed=params.seed,
            logprobs=0 if params.logprobs else None,
            output_kind=RequestOutputKind.FINAL_ONLY,
            **optional,
        )
    except (ValueError, VLLMError) as exc:
        raise InvalidRequestError(f"vllm refused the sampling parameters: {exc}") from exc


_shared = functools.lru_cache(maxsize=64)(_converted)


def prompt_ids(tokenizer: Any, request: GenerationRequest) -> list[int]:
    """A text or token prompt as token ids (chat prompts are rendered by `_chat.ChatPath`).

    Text is encoded with the tokenizer's special tokens, as ``/v1/completions`` encodes it; token ids are
    taken as given.
    """
    prompt = request.prompt
    if isinstance(prompt, str):
        # Encoded here rather than by vLLM: passing raw strings to AsyncLLM is deprecated in vLLM.
        ids: list[int] = tokenizer.encode(prompt, add_special_tokens=True)
        return ids
    return list(prompt)  # type: ignore[arg-type]  # token ids


def engine_input(engine: AsyncLLM, ids: list[int]) -> Any:
    """What ``AsyncLLM.generate`` is given for a prompt of token ids."""
    tokens = TokensPrompt(prompt_token_ids=ids)
    render = getattr(getattr(engine, "renderer", None), "render_cmpl", None)
    if render is None:  # older vLLM: AsyncLLM takes the prompt itself
        return tokens
    # A rendered engine input is processed inline on this loop; a plain TokensPrompt would be sent to
    # vLLM's one-thread executor and back for every request (measured: see docs/benchmarks.md).
    return render([tokens])[0]


def completions(output: RequestOutput, *, logprobs: bool) -> tuple[Completion, ...]:
    """The completions of one vLLM request output, in index order, with the sampled tokens' logprobs."""
    result = []
    for out in sorted(output.outputs, key=lambda c: c.index):
        token_ids = tuple(out.token_ids)
        steps = None
        if logprobs and out.logprobs is not None:
            steps = tuple(
                logprob_of(step, token) for step, token in zip(out.logprobs, token_ids, strict=True)
            )
        result.append(Completion(out.text, token_ids, steps, out.finish_reason))
    return tuple(result)
