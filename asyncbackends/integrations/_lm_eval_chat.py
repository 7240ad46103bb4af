"""lm-eval's chat-templated and multimodal requests as chat prompts (for the lm-eval integration).

With ``--apply_chat_template`` lm-eval asks the model to render each few-shot history into the context string
itself (``LM.apply_chat_template``). Rendering is the backend's business here (the vllm adapter renders as
``LLM.chat`` does; a server applies its own template), so the string handed back is the messages themselves,
marked and JSON-encoded, and `chat_prompt` turns a context back into them. Multimodal tasks pass images beside
the context (``{"visual": [PIL images]}``) with an ``<image>`` placeholder where each goes; they become image
parts in the user message, split at the placeholders exactly as lm-eval's own ``vllm-vlm`` model splits them
(its default ``interleave=True``): text before the first placeholder, an image, the text after, and so on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._chat import image_part
from ..errors import InvalidRequestError

__all__ = ["IMAGE_PLACEHOLDER", "chat_prompt", "encode_history", "refuse_chat_scoring"]

IMAGE_PLACEHOLDER = "<image>"
"""Where lm-eval's multimodal tasks put each image in a context (its ``DEFAULT_IMAGE_PLACEHOLDER``)."""

# Starts every context this integration renders: no task's text begins with it.
_MARK = "\x00asyncbackends-chat\x00"


def encode_history(chat_history: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
    """The context string standing for ``chat_history`` (what ``LM.apply_chat_template`` returns).

    Raises:
        InvalidRequestError: ``add_generation_prompt=False`` (continuing the last message: lm-eval's
            ``gen_prefix``), which a chat request cannot express.
    """
    if not add_generation_prompt:
        raise InvalidRequestError(
            "lm-eval asked to continue the final message (a task with gen_prefix); asyncbackends sends chat "
            "prompts with a generation prompt only: run this task without --apply_chat_template"
        )
    messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in chat_history]
    return _MARK + json.dumps(messages, ensure_ascii=False)


def refuse_chat_scoring(contexts: Sequence[str]) -> None:
    """Refuse scoring chat-templated contexts: scoring takes text, and the template is the backend's.

    Raises:
        InvalidRequestError: One of ``contexts`` came from ``apply_chat_template``.
    """
    if any(context.startswith(_MARK) for context in contexts):
        raise InvalidRequestError(
            "with --apply_chat_template the asyncbackends model runs generation tasks only (the backend "
            "renders chat; scoring takes plain text): run loglikelihood tasks without it"
        )


def chat_prompt(context: str, visuals: Sequence[Any] | None) -> str | list[dict[str, Any]]:
    """The prompt for one generation request: the chat it stands for, with its images, or the text itself.

    Raises:
        InvalidRequestError: Images with a context that is not chat-templated (run lm-eval with
            ``--apply_chat_template``), more placeholders than images, or images no placeholder places
            (lm-eval's ``vllm-vlm`` passes every image: one left out would be a silently different question).
    """
    if not context.startswith(_MARK):
        if visuals:
            raise InvalidRequestError(
                "lm-eval's multimodal requests need --apply_chat_template with the asyncbackends model: the "
                "backend renders images through the chat template"
            )
        return context
    messages: list[dict[str, Any]] = json.loads(context[len(_MARK) :])
    images = list(visuals or ())
    used = 0
    for message in messages:
        text = message["content"]
        if IMAGE_PLACEHOLDER not in text:
            continue
        pieces = text.split(IMAGE_PLACEHOLDER)
        parts: list[dict[str, Any]] = []
        for index, piece in enumerate(pieces):
            if piece:
                parts.append({"type": "text", "text": piece})
            if index < len(pieces) - 1:  # a placeholder followed this piece
                if used >= len(images):
                    raise InvalidRequestError(
                        f"the context has more {IMAGE_PLACEHOLDER} placeholders than the {len(images)} "
                        "images lm-eval passed"
                    )
                parts.append(image_part(images[used]))
                used += 1
        message["content"] = parts
    if used < len(images):
        raise InvalidRequestError(
            f"lm-eval passed {len(images)} image(s) but the context has {used} {IMAGE_PLACEHOLDER} "
            f"placeholder(s): {len(images) - used} image(s) would not be sent; the task must put one "
            f"{IMAGE_PLACEHOLDER} where each image goes"
        )
    return messages
