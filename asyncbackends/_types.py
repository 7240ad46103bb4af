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
from typing import Any, Literal, TypeAlias

from ._capabilities import Capabilities as Capabilities
from ._field_checks import check_request_id, is_int, set_field
from ._results import Completion as Completion
from ._results import FinishReason as FinishReason
from ._results import GenerationResult as GenerationResult
from ._results import LoglikelihoodResult as LoglikelihoodResult
from ._results import Result as Result
from ._sampling_params import OPTIONAL_SAMPLING_PARAMS as OPTIONAL_SAMPLING_PARAMS
from ._sampling_params import SamplingParams as SamplingParams
from .errors import InvalidRequestError

__all__ = [
    "CHAT_ROLES",
    "ChatMessage",
    "GenerationRequest",
    "LoglikelihoodRequest",
    "Prompt",
    "Request",
    "RollingLoglikelihoodRequest",
]

ChatMessage: TypeAlias = Mapping[str, str]
"""One chat message: ``{"role": "user", "content": "..."}``."""

Prompt: TypeAlias = str | tuple[ChatMessage, ...] | tuple[int, ...]
"""A prompt after normalisation: text, chat messages, or token ids."""

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
"""The chat roles a `GenerationRequest` accepts."""


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
        return tuple(_normalise_message(i, m) for i, m in enumerate(prompt))
    raise InvalidRequestError("prompt list must hold only token ids (int) or only chat messages (dict)")


def _normalise_message(index: int, message: Mapping[str, Any]) -> ChatMessage:
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise InvalidRequestError(f"prompt[{index}].role must be one of {sorted(CHAT_ROLES)}, got {role!r}")
    content = message.get("content")
    if not isinstance(content, str):
        raise InvalidRequestError(f"prompt[{index}].content must be a str, got {type(content).__name__}")
    extra = set(message) - {"role", "content", "name"}
    if extra:
        raise InvalidRequestError(f"prompt[{index}] has unknown keys {sorted(extra)}")
    return dict(message)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """Generate text for one prompt.

    Args:
        prompt: Text, a list of chat messages (``{"role", "content"}``), or a list of token ids.
        params: How to sample.
        request_id: Your id for this request; echoed in its result and errors.
    """

    prompt: Prompt
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str | None = None

    def __post_init__(self) -> None:
        set_field(self, "prompt", _normalise_prompt(self.prompt))
        if not isinstance(self.params, SamplingParams):
            raise InvalidRequestError(f"params must be SamplingParams, got {type(self.params).__name__}")
        check_request_id(self.request_id)

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
    """

    context: str
    continuation: str
    request_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.context, str):
            raise InvalidRequestError(f"context must be a str, got {type(self.context).__name__}")
        if not isinstance(self.continuation, str) or not self.continuation:
            raise InvalidRequestError("continuation must be a non-empty str")
        check_request_id(self.request_id)


@dataclass(frozen=True, slots=True)
class RollingLoglikelihoodRequest:
    """Score a whole text (perplexity tasks): the sum over windows of the model's length.

    Args:
        text: The text to score; must not be empty.
        request_id: Your id for this request.
    """

    text: str
    request_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text:
            raise InvalidRequestError("text must be a non-empty str")
        check_request_id(self.request_id)


Request: TypeAlias = GenerationRequest | LoglikelihoodRequest | RollingLoglikelihoodRequest
