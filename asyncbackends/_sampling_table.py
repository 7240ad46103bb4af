"""The one table of sampling parameters: each `SamplingParams` field, its range, flag and names elsewhere.

`SamplingParams` validates the optional float parameters against `SamplingParamSpec.bounds`; `Capabilities`
has a flag of each optional parameter's name; the adapters' wire builders send a parameter under the name this
table gives for their wire, and the integrations read a framework's name for it here.

A wire name is a **plain rename**: the adapter sends the parameter's value unchanged under that key (a
sequence as a list), and an optional parameter whenever it is set; for a core parameter the builder still
decides when to leave a default out (``top_p`` 1, ``n`` 1...). Where an adapter handles a parameter in its own
code, the table has ``None`` for it and the adapter's code says how: ``logprobs`` (each wire's own shape),
``json_schema`` and ``regex`` (structured output: vLLM's ``StructuredOutputsParams``, OpenAI's
``response_format``, TGI's ``grammar``), ``seed`` on TGI (``seed + i`` per completion), ``n`` on TGI (fanned
out), ``stop`` with a reasoning parser (applied to the answer only), ``reasoning_effort`` on vLLM (no such
field), ``top_k`` on TGI's chat route (refused), and the integrations' values that need converting
(lighteval's ``response_format``, inspect's ``response_schema``). tests/params/test_sampling_table.py checks
that every field is here and that every builder sends what the table says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["OPTIONAL_SPECS", "SAMPLING_TABLE", "SPECS", "SamplingParamSpec"]


@dataclass(frozen=True, slots=True)
class SamplingParamSpec:
    """One `SamplingParams` field and its names elsewhere (``None``: no plain rename there).

    Args:
        name: The field's name on `SamplingParams`.
        optional: ``None`` unless set, and honoured only where `Capabilities` has the flag of this name.
        capability: The `Capabilities` flag that says a backend honours it (``None``: every backend does).
        bounds: ``(low, high, low included)`` of an optional float parameter; the high end is included.
        needs_logits: Acts on the logits (a penalty, ``min_p``): a backend without logits cannot honour it.
        example: A value every backend that honours it accepts, and which changes outputs (the contract
            suite sends it).
        vllm: The field of vLLM's ``SamplingParams`` (the in-process adapter).
        openai: The body key of every OpenAI-compatible server.
        openai_vllm: The body key only a vLLM server takes (one of its extra fields); other servers refuse.
        tgi: The key of TGI's ``/generate`` ``parameters``.
        tgi_chat: The body key of TGI's ``/v1/chat/completions``; a parameter with a ``tgi`` name and none
            here is refused for chat prompts.
        lm_eval: lm-eval's ``gen_kwargs`` names for it (after its normalisation).
        lighteval: lighteval's ``GenerationParameters`` field.
        inspect_ai: inspect_ai's ``GenerateConfig`` field.
    """

    name: str
    optional: bool = False
    capability: str | None = None
    bounds: tuple[float, float, bool] | None = None
    needs_logits: bool = False
    example: Any = None
    vllm: str | None = None
    openai: str | None = None
    openai_vllm: str | None = None
    tgi: str | None = None
    tgi_chat: str | None = None
    lm_eval: tuple[str, ...] = ()
    lighteval: str | None = None
    inspect_ai: str | None = None


def _same(name: str, **names: Any) -> dict[str, Any]:
    """Every wire and framework calls it ``name``, unless ``names`` says otherwise."""
    wires = ("vllm", "openai", "tgi", "tgi_chat", "lighteval", "inspect_ai")
    same: dict[str, Any] = dict.fromkeys(wires, name)
    return {"name": name, **same, "lm_eval": (name,), **names}


def _optional(name: str, example: Any, **names: Any) -> SamplingParamSpec:
    """An optional parameter: no wire or framework name unless ``names`` gives it."""
    return SamplingParamSpec(name=name, optional=True, capability=name, example=example, **names)


# In SamplingParams' declaration order; OPTIONAL_SAMPLING_PARAMS (and so every refusal's list) follows it.
SAMPLING_TABLE: tuple[SamplingParamSpec, ...] = (
    SamplingParamSpec(
        **_same("max_tokens", tgi="max_new_tokens", lm_eval=("max_gen_toks",), lighteval="max_new_tokens")
    ),
    SamplingParamSpec(**_same("temperature")),
    SamplingParamSpec(**_same("top_p")),
    SamplingParamSpec(**_same("top_k", tgi_chat=None)),
    SamplingParamSpec(
        **_same(
            "stop", capability="stop", lm_eval=("until",), lighteval="stop_tokens", inspect_ai="stop_seqs"
        )
    ),
    SamplingParamSpec(
        **_same(
            "n",
            capability="n_samples",
            tgi=None,  # fanned out into n requests
            tgi_chat=None,
            lm_eval=(),
            lighteval=None,  # a document's num_samples
            inspect_ai="num_choices",
        )
    ),
    SamplingParamSpec(**_same("seed", capability="seed", tgi=None, tgi_chat=None)),
    SamplingParamSpec(name="logprobs", capability="logprobs", inspect_ai="logprobs"),
    _optional(
        "repetition_penalty",
        1.3,
        bounds=(0.0, math.inf, False),
        needs_logits=True,
        vllm="repetition_penalty",
        openai_vllm="repetition_penalty",
        tgi="repetition_penalty",  # TGI's chat route has none
        lm_eval=("repetition_penalty",),
        lighteval="repetition_penalty",
    ),
    _optional(
        "presence_penalty",
        0.5,
        bounds=(-2.0, 2.0, True),
        needs_logits=True,
        vllm="presence_penalty",
        openai="presence_penalty",
        lm_eval=("presence_penalty",),
        lighteval="presence_penalty",
        inspect_ai="presence_penalty",
    ),
    _optional(
        "frequency_penalty",
        0.5,
        bounds=(-2.0, 2.0, True),
        needs_logits=True,
        vllm="frequency_penalty",
        openai="frequency_penalty",
        tgi="frequency_penalty",
        tgi_chat="frequency_penalty",
        lm_eval=("frequency_penalty",),
        lighteval="frequency_penalty",
        inspect_ai="frequency_penalty",
    ),
    _optional(
        "min_p",
        0.1,
        bounds=(0.0, 1.0, True),
        needs_logits=True,
        vllm="min_p",
        openai_vllm="min_p",
        lm_eval=("min_p",),
        lighteval="min_p",
    ),
    _optional(
        "min_tokens",
        4,
        vllm="min_tokens",
        openai_vllm="min_tokens",
        lm_eval=("min_tokens", "min_new_tokens"),  # transformers' name too
        lighteval="min_new_tokens",
    ),
    _optional(
        "json_schema",
        {
            "type": "object",
            "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
            "required": ["answer", "sure"],
            "additionalProperties": False,
        },
        lm_eval=("json_schema",),
    ),
    _optional("regex", "(yes|no|maybe)", lm_eval=("regex",)),
    _optional("reasoning_effort", "low", openai="reasoning_effort", inspect_ai="reasoning_effort"),
    _optional(
        "thinking_budget",
        8,
        vllm="thinking_token_budget",
        openai_vllm="thinking_token_budget",
        inspect_ai="reasoning_tokens",
    ),
)
"""Every `SamplingParams` field, in declaration order."""

SPECS: Mapping[str, SamplingParamSpec] = {spec.name: spec for spec in SAMPLING_TABLE}
"""The table by field name."""

OPTIONAL_SPECS: tuple[SamplingParamSpec, ...] = tuple(spec for spec in SAMPLING_TABLE if spec.optional)
"""The optional parameters (a backend may not honour them), in declaration order."""
