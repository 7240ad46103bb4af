"""How servers and engines say that a prompt plus ``max_tokens`` do not fit the model: one list for all.

Read by `_http.error_for_status` (HTTP answers) and the ``vllm`` adapter (the engine's own validation
errors), so that every adapter raises `ContextLengthError` for the same refusal.
"""

from __future__ import annotations

__all__ = ["says_context_length"]

_MARKERS = (
    "context_length_exceeded",  # OpenAI's error code
    "maximum context length",  # OpenAI's wording, shared by vLLM serve's renderer and its max_tokens clamp
    "longer than the maximum model length",  # vLLM's input processor: the prompt leaves no room
    "cannot be greater than max_model_len",  # vLLM serve: max_tokens alone is over the model's length
    "`inputs` tokens + `max_new_tokens` must be",  # TGI's router
    "`inputs` must have less than",  # TGI's router: the prompt alone is over max_input_tokens
)


def says_context_length(text: str) -> bool:
    """Whether an error's text is a refusal for length (see the markers above)."""
    return any(marker in text for marker in _MARKERS)
