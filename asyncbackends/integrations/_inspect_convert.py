"""inspect_ai's requests and outputs to and from this library's types (the provider is `inspect_ai.py`).

Every `GenerateConfig` field is in exactly one of three groups: mapped onto `SamplingParams`
(`_MAPPED`), honoured by inspect itself before the provider is called (`_INSPECT_SIDE`), or refused when
set (everything else, so a field a later inspect adds fails loudly instead of being dropped).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageTool,
    Content,
    ContentImage,
    ContentReasoning,
    ContentText,
    GenerateConfig,
    Logprob,
    Logprobs,
    ModelOutput,
    ModelUsage,
    StopReason,
)
from inspect_ai.model._call_tools import parse_tool_call
from inspect_ai.model._reasoning import reasoning_to_think_tag
from inspect_ai.tool import ToolChoice, ToolFunction, ToolInfo

from asyncbackends._capabilities import Capabilities
from asyncbackends._chat import Tool, ToolCall, image_part
from asyncbackends._results import Completion, GenerationResult
from asyncbackends._sampling_params import SamplingParams
from asyncbackends._sampling_table import SAMPLING_TABLE
from asyncbackends._usage import Pricing, Usage
from asyncbackends.errors import InvalidRequestError

__all__ = [
    "INSPECT_SIDE",
    "MAPPED",
    "messages_of",
    "model_output",
    "sampling_params",
    "tool_choice_of",
    "tools_of",
]

MAPPED: Mapping[str, str] = {
    # The table's names; stop_seqs' list becomes a tuple and response_schema is unwrapped in sampling_params.
    **{spec.inspect_ai: spec.name for spec in SAMPLING_TABLE if spec.inspect_ai},
    "response_schema": "json_schema",
}
"""`GenerateConfig` field -> the `SamplingParams` field it sets."""

INSPECT_SIDE = frozenset(
    {
        # Retries, timeouts and concurrency: inspect's own retry loop and connection pool.
        "max_retries",
        "timeout",
        "attempt_timeout",
        "stream_idle_timeout",
        "max_connections",
        "adaptive_connections",
        # Applied to the messages (system prompt, tool output size) before they reach the provider.
        "system_message",
        "max_tool_output",
        "internal_tools",
        # inspect's response cache, fallback models and refusal handling sit above the provider.
        "cache",
        "fallback_models",
        "fail_on_refusal",
        # inspect drops reasoning from the history it hands the provider ("none", "last", "auto": our
        # `auto_reasoning_history`) before calling it; what is left is sent as <think> text (`messages_of`).
        "reasoning_history",
    }
)
"""`GenerateConfig` fields inspect honours itself: nothing for a provider to send."""

# Values of otherwise refused fields that ask for nothing (so a config that spells out a default passes).
_NEUTRAL: Mapping[str, Callable[[Any], bool]] = {
    "top_logprobs": lambda v: v == 0,
    "best_of": lambda v: v == 1,
    "cache_prompt": lambda v: v in ("auto", False),
    "parallel_tool_calls": lambda v: v is True,
    "batch": lambda v: v is False,
    "modalities": lambda v: list(v) == ["text"],
    "logit_bias": lambda v: not v,
    "extra_headers": lambda v: not v,
    "extra_body": lambda v: not v,
    "reasoning_summary": lambda v: v == "none",
}

# Why each refused field cannot be honoured: said in the error.
_WHY = {
    "top_logprobs": "results carry each generated token's logprob only, not its alternatives",
    "logit_bias": "SamplingParams has no logit bias",
    "best_of": "SamplingParams has no best_of; use num_choices",
    "prompt_logprobs": "generation results carry no prompt logprobs",
    "extra_headers": "backends take their HTTP settings as model args (-M)",
    "extra_body": "backends take their settings as model args (-M)",
    "reasoning_summary": "backends return the thinking itself (ContentReasoning), not a summary of it",
}


def _refuse(name: str, value: Any, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"GenerateConfig.{name}={value!r} cannot be honoured by asyncbackends: {why}")


def sampling_params(config: GenerateConfig, capabilities: Capabilities, backend: str) -> SamplingParams:
    """The `SamplingParams` of ``config``; each field is mapped exactly or refused, naming it.

    Args:
        config: The sample's generate config (inspect merges the model's and the task's).
        capabilities: The backend's capabilities (a field it cannot honour is refused here).
        backend: The backend's name, for the errors.

    Raises:
        InvalidRequestError: A set field that cannot reach the backend exactly; the message names it.
    """
    values: dict[str, Any] = {}
    for name in type(config).model_fields:
        value = getattr(config, name)
        if value is None or name in INSPECT_SIDE:
            continue
        if name in MAPPED:
            values[MAPPED[name]] = value
        elif not (name in _NEUTRAL and _NEUTRAL[name](value)):
            why = _WHY.get(name, "no backend of this library has this setting")
            raise _refuse(name, value, why)
    if "stop" in values:
        values["stop"] = tuple(values["stop"])
    if "json_schema" in values:
        values["json_schema"] = values["json_schema"].json_schema.model_dump(exclude_none=True, by_alias=True)
    try:
        params = SamplingParams(**values)
    except InvalidRequestError as exc:
        ours = {v: k for k, v in MAPPED.items()}
        named = ", ".join(f"{ours[k]} -> {k}" for k in values if ours[k] != k)
        raise InvalidRequestError(
            f"GenerateConfig rejected: {exc}" + (f" (inspect's names: {named})" if named else "")
        ) from exc
    _check_capabilities(config, params, capabilities, backend)
    return params


def _check_capabilities(
    config: GenerateConfig, params: SamplingParams, capabilities: Capabilities, backend: str
) -> None:
    # The adapters refuse unsupported parameters too, but under this library's names; refused here the
    # message names the GenerateConfig field the user set.
    lacking = [
        ("seed", config.seed is not None and not capabilities.seed),
        ("num_choices", params.n > 1 and not capabilities.n_samples),
        ("logprobs", params.logprobs and not capabilities.logprobs),
        ("stop_seqs", bool(params.stop) and not capabilities.stop),
    ]
    ours = {v: k for k, v in MAPPED.items()}
    lacking += [(ours.get(name, name), True) for name in capabilities.unsupported(params)]
    for name, missing in lacking:
        if missing:
            value = getattr(config, name)
            raise _refuse(name, value, f"the {backend} backend does not honour it (its capabilities say so)")


def _parts_of(message: ChatMessage, index: int) -> str | list[dict[str, Any]]:
    if isinstance(message.content, str):
        return message.content
    parts: list[dict[str, Any]] = []
    for number, part in enumerate(message.content):
        if isinstance(part, ContentText):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, ContentReasoning):
            # Reasoning history inspect kept (`reasoning_history`): sent as <think> text, as inspect's own
            # OpenAI-compatible, vLLM and Hugging Face providers send it.
            parts.append({"type": "text", "text": reasoning_to_think_tag(part)})
        elif isinstance(part, ContentImage):
            if part.detail != "auto":
                raise InvalidRequestError(
                    f"input[{index}].content[{number}].detail={part.detail!r}: backends take no image detail"
                )
            parts.append(image_part(part.image))
        else:
            raise InvalidRequestError(
                f"input[{index}].content[{number}] is {type(part).__name__}: asyncbackends sends text, "
                "reasoning and images only"
            )
    if all(p["type"] == "text" for p in parts):
        # vLLM's chat rendering joins the text parts of a string-format template with newlines: the same here,
        # so text-only content reaches every backend as the plain string it is.
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool_result(message: ChatMessageTool, index: int) -> dict[str, Any]:
    if message.tool_call_id is None:
        raise InvalidRequestError(f"input[{index}] is a tool result without tool_call_id")
    content = _parts_of(message, index)
    if message.error is not None:
        # As inspect's own OpenAI provider sends a failed tool call back to the model.
        content = f"Error: {message.error.message}"
    return {"role": "tool", "tool_call_id": message.tool_call_id, "content": content}


def messages_of(input: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Inspect's chat messages as OpenAI-shaped message dicts (a `GenerationRequest` prompt).

    Text becomes a string, images ``image_url`` parts (`image_part`), tool calls and tool results OpenAI's
    ``tool_calls`` and ``role: "tool"`` messages.

    Raises:
        InvalidRequestError: A message holds content other than text and images.
    """
    messages: list[dict[str, Any]] = []
    for index, message in enumerate(input):
        if isinstance(message, ChatMessageTool):
            messages.append(_tool_result(message, index))
            continue
        converted: dict[str, Any] = {"role": message.role, "content": _parts_of(message, index)}
        if isinstance(message, ChatMessageAssistant) and message.tool_calls:
            converted["tool_calls"] = [
                ToolCall(c.id, c.function, json.dumps(c.arguments)).to_openai() for c in message.tool_calls
            ]
        messages.append(converted)
    return messages


def tools_of(tools: Sequence[ToolInfo]) -> tuple[Tool, ...]:
    """Inspect's tool descriptions as `Tool` (the parameters as their JSON Schema)."""
    return tuple(
        Tool(t.name, t.description, t.parameters.model_dump(exclude_none=True, by_alias=True)) for t in tools
    )


def tool_choice_of(choice: ToolChoice) -> str:
    """``"auto"``/``"none"`` as they are, ``"any"`` as ``"required"``, a `ToolFunction` as its name."""
    if isinstance(choice, ToolFunction):
        return choice.name
    return "required" if choice == "any" else choice


_STOP_REASONS: Mapping[str, StopReason] = {"stop": "stop", "length": "max_tokens", "tool_calls": "tool_calls"}


def _logprobs(completion: Completion, token_text: Callable[[int], str]) -> Logprobs | None:
    values = completion.logprobs
    if values is None:
        return None
    if len(completion.token_texts) == len(values):
        # The server's own spelling of each token (HTTP servers name tokens by text, most send no ids).
        tokens = list(completion.token_texts)
    elif len(completion.token_ids) == len(values):
        tokens = [token_text(t) for t in completion.token_ids]
    else:
        # Neither texts nor ids to name the tokens by: the values alone would not make an inspect Logprob.
        raise InvalidRequestError(
            f"the backend returned {len(values)} logprobs but neither the texts nor the ids of their tokens"
        )
    return Logprobs(content=[Logprob(token=t, logprob=lp) for t, lp in zip(tokens, values, strict=True)])


def _message(completion: Completion, model: str, tools: list[ToolInfo]) -> ChatMessageAssistant:
    calls = [
        # inspect's own parser: arguments that are not JSON become the call's parse_error, which inspect
        # reports to the model instead of running the tool.
        parse_tool_call(c.id, c.name, c.arguments, tools)
        for c in completion.tool_calls
    ]
    content: str | list[Content] = completion.text
    if completion.reasoning or completion.reasoning_truncated:
        # The thinking apart from the answer, as inspect's providers for reasoning models return it: the
        # message's text (what scorers read) is the answer alone.
        content = [ContentReasoning(reasoning=completion.reasoning or ""), ContentText(text=completion.text)]
    return ChatMessageAssistant(
        content=content,
        model=model,
        source="generate",
        tool_calls=calls or None,
    )


def _stop_reason(completion: Completion) -> StopReason:
    if completion.reasoning_truncated:
        return "max_tokens"  # cut off while thinking, whatever word the backend used
    return _STOP_REASONS.get(completion.finish_reason or "", "unknown")


def model_output(
    result: GenerationResult,
    *,
    model: str,
    tools: list[ToolInfo],
    input_tokens: int,
    output_tokens: Callable[[Completion], int],
    token_text: Callable[[int], str],
    pricing: Pricing | None = None,
) -> ModelOutput:
    """The `ModelOutput` of one result: a choice per completion, usage filled in.

    A completion with reasoning becomes a message of a `ContentReasoning` and the answer's `ContentText`;
    one cut off while thinking stops for ``"max_tokens"`` with an empty answer.

    Args:
        result: What the backend returned.
        model: The model name when the result names none.
        tools: The tools offered (inspect's parser checks the calls against them).
        input_tokens: Prompt tokens (the backend's count where it reports one).
        output_tokens: Tokens of one completion (its token ids, else counted), where the result has no
            count of the backend's (`GenerationResult.generated_tokens`).
        token_text: A token id's text, for logprobs the backend gave with token ids but not their texts.
        pricing: The backend's prices: the result's cost goes in ``usage.total_cost``.
    """
    name = result.model or model
    choices = [
        ChatCompletionChoice(
            message=_message(c, name, tools),
            stop_reason=_stop_reason(c),
            logprobs=_logprobs(c, token_text),
        )
        for c in result.completions
    ]
    generated = result.generated_tokens  # the server's own count, where it reports one
    if generated is None:
        generated = sum(output_tokens(c) for c in result.completions)
    thinking = any(c.reasoning is not None or c.reasoning_tokens for c in result.completions)
    usage = ModelUsage(
        input_tokens=input_tokens,
        output_tokens=generated,  # thinking included, as OpenAI counts completion tokens
        total_tokens=input_tokens + generated,
        reasoning_tokens=sum(c.reasoning_tokens for c in result.completions) if thinking else None,
        # Of the input tokens, those read from a prompt cache (as inspect's own OpenAI provider fills it).
        input_tokens_cache_read=result.cached_prompt_tokens,
    )
    if pricing is not None:
        counted = Usage(
            input_tokens, result.cached_prompt_tokens or 0, generated, usage.reasoning_tokens or 0
        )
        usage.total_cost = pricing.cost(counted)
    return ModelOutput(model=name, choices=choices, usage=usage)
