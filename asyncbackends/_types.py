"""Requests, results and capabilities: frozen, slotted dataclasses validated at construction.

Validation happens when a request is built, so nothing invalid ever reaches a backend; each failure raises
`InvalidRequestError` naming the field.
"""

# This module holds the requests and their prompts; the results (_results.py), SamplingParams
# (_sampling_params.py) and Capabilities (_capabilities.py) live beside it, one concept a module, and are
# re-exported from here for the package's own imports (the public home of them all is `asyncbackends`).

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from ._capabilities import Capabilities as Capabilities
from ._chat import CHAT_ROLES as CHAT_ROLES
from ._chat import TOOL_CHOICES, image_urls, normalise_message
from ._chat import ChatMessage as ChatMessage
from ._chat import Tool as Tool
from ._chat import ToolCall as ToolCall
from ._chat import uses_tools as _uses_tools
from ._field_checks import check_adapter, check_request_id, is_int, set_field
from ._results import Completion as Completion
from ._results import FinishReason as FinishReason
from ._results import GenerationResult as GenerationResult
from ._results import LoglikelihoodResult as LoglikelihoodResult
from ._results import Result as Result
from ._sampling_params import OPTIONAL_SAMPLING_PARAMS as OPTIONAL_SAMPLING_PARAMS
from ._sampling_params import SamplingParams as SamplingParams
from .errors import InvalidRequestError

__all__ = [
    "GenerationRequest",
    "LoglikelihoodRequest",
    "Prompt",
    "Request",
    "RollingLoglikelihoodRequest",
]

Prompt: TypeAlias = str | tuple[ChatMessage, ...] | tuple[int, ...]
"""A prompt after normalisation: text, chat messages, or token ids."""


def _normalise_prompt(prompt: object) -> Prompt:
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt must not be empty")
        return prompt
    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
        raise InvalidRequestError(
            "prompt must be a str, a list of chat messages or a list of token ids, "
            f"got {type(prompt).__name__}"
        )
    if len(prompt) == 0:
        raise InvalidRequestError("prompt must not be empty")
    if all(is_int(t) for t in prompt):
        if any(t < 0 for t in prompt):
            raise InvalidRequestError("prompt token ids must be >= 0")
        return tuple(prompt)
    if all(isinstance(m, Mapping) for m in prompt):
        return tuple(normalise_message(i, m) for i, m in enumerate(prompt))
    raise InvalidRequestError("prompt list must hold only token ids (int) or only chat messages (dict)")


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """Generate text for one prompt.

    Args:
        prompt: Text, a list of chat messages in OpenAI's shape (``{"role", "content"}``, content parts,
            ``tool_calls``, ``role: "tool"`` messages: see the page "Chat, images and tools"), or a list
            of token ids.
        params: How to sample.
        request_id: Your id for this request; echoed in its result and errors.
        tools: The functions the model may call (`Tool`, or OpenAI's ``{"type": "function", ...}`` dicts);
            only with a chat prompt.
        tool_choice: ``"auto"`` (the model decides), ``"none"``, ``"required"`` (at least one call) or the
            name of one of ``tools`` (a call to it). A tool named ``auto``, ``none`` or ``required``
            cannot be chosen by that word (it is the mode): such a request is refused.
        adapter: The name of the LoRA adapter to generate with (a name the backend serves: the ``vllm``
            adapter's ``lora_modules``, a server's LoRA module, TGI's ``adapter_id``); ``None``: the base
            model. A backend whose capabilities do not claim ``adapters`` refuses a request naming one.
    """

    prompt: Prompt
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str | None = None
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"
    adapter: str | None = None

    def __post_init__(self) -> None:
        set_field(self, "prompt", _normalise_prompt(self.prompt))
        if not isinstance(self.params, SamplingParams):
            raise InvalidRequestError(f"params must be SamplingParams, got {type(self.params).__name__}")
        check_request_id(self.request_id)
        check_adapter(self.adapter)
        set_field(self, "tools", _normalise_tools(self.tools))
        if self.tools and self.prompt_kind != "chat":
            raise InvalidRequestError("tools need a chat prompt (a list of messages)")
        names = {t.name for t in self.tools}
        if not isinstance(self.tool_choice, str) or (
            self.tool_choice not in TOOL_CHOICES and self.tool_choice not in names
        ):
            raise InvalidRequestError(
                "tool_choice must be 'auto', 'none', 'required' or the name of one of tools "
                f"{sorted(names)}, got {self.tool_choice!r}"
            )
        if self.tool_choice in TOOL_CHOICES and self.tool_choice in names:
            # One str holds modes and names: the word is the mode, so the tool could never be forced by it.
            raise InvalidRequestError(
                f"a tool named {self.tool_choice!r} cannot be told from tool_choice={self.tool_choice!r} "
                "(the mode); rename the tool"
            )
        if self.tool_choice == "required" and not self.tools:
            raise InvalidRequestError("tool_choice='required' needs tools")

    @property
    def images(self) -> tuple[str, ...]:
        """The URLs of the prompt's image parts, in order (empty for text and token prompts)."""
        return tuple(image_urls(self.prompt)) if self.prompt_kind == "chat" else ()  # type: ignore[arg-type]

    @property
    def uses_tools(self) -> bool:
        """Whether the request offers tools or its messages hold tool calls or tool results."""
        return bool(self.tools) or (self.prompt_kind == "chat" and _uses_tools(self.prompt))  # type: ignore[arg-type]

    @property
    def prompt_kind(self) -> Literal["text", "chat", "tokens"]:
        """Which of the three prompt forms this request holds."""
        if isinstance(self.prompt, str):
            return "text"
        return "tokens" if is_int(self.prompt[0]) else "chat"


@dataclass(frozen=True, slots=True)
class LoglikelihoodRequest:
    """Score ``continuation`` given ``context``: log P(continuation | context).

    Args:
        context: The conditioning text (may be empty: the model's BOS/EOS token then stands in).
        continuation: The text to score; must not be empty.
        request_id: Your id for this request.
        adapter: The LoRA adapter to score with (see `GenerationRequest`); ``None``: the base model.
    """

    context: str
    continuation: str
    request_id: str | None = None
    adapter: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.context, str):
            raise InvalidRequestError(f"context must be a str, got {type(self.context).__name__}")
        if not isinstance(self.continuation, str) or not self.continuation:
            raise InvalidRequestError("continuation must be a non-empty str")
        check_request_id(self.request_id)
        check_adapter(self.adapter)


@dataclass(frozen=True, slots=True)
class RollingLoglikelihoodRequest:
    """Score a whole text (perplexity tasks): the sum over windows of the model's length.

    Args:
        text: The text to score; must not be empty.
        request_id: Your id for this request.
        adapter: The LoRA adapter to score with (see `GenerationRequest`); ``None``: the base model.
    """

    text: str
    request_id: str | None = None
    adapter: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text:
            raise InvalidRequestError("text must be a non-empty str")
        check_request_id(self.request_id)
        check_adapter(self.adapter)


def _normalise_tools(tools: object) -> tuple[Tool, ...]:
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise InvalidRequestError(f"tools must be a sequence of Tool, got {type(tools).__name__}")
    out = tuple(t if isinstance(t, Tool) else Tool.from_openai(t) for t in tools)
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise InvalidRequestError(f"tools must have distinct names, got {names}")
    return out


Request: TypeAlias = GenerationRequest | LoglikelihoodRequest | RollingLoglikelihoodRequest
