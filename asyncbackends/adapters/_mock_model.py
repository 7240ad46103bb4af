"""The mock's model: what it answers, how stop strings and limits cut it, what it calls and how it scores.

Pure functions of the request, so `MockBackend` (``asyncbackends.adapters.mock``, whose docstring states the
rules) keeps only what a backend does: options, counters, injected latency and failures.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .._chat import image_digest
from .._types import FinishReason, GenerationRequest, SamplingParams, ToolCall
from ..errors import RequestRejectedError
from ._minimal_match import NoMatchError, minimal_json, minimal_regex_match

__all__ = [
    "answer_within",
    "constrained_text",
    "content_text",
    "cut_at_stop",
    "echo_logprobs",
    "score",
    "tool_call",
]


def content_text(content: str | list[dict[str, Any]]) -> str:
    """A message's content as the mock reads it: text parts as they are, images as their digest."""
    if isinstance(content, str):
        return content
    return "".join(
        p["text"] if p["type"] == "text" else f"[image {image_digest(p['image_url']['url'])}]"
        for p in content
    )


def _token_logprob(previous: str, token: str, salt: int = 0) -> float:
    """The logprob of ``token`` after ``previous``."""
    # A fixed, made-up distribution: deterministic and always negative.
    return -((ord(previous) * 31 + ord(token) + salt) % 13 + 1) / 10


def _adapter_salt(adapter: str | None) -> int:
    """What an adapter adds to every score: 0 for the base model."""
    # 1..12, never 0 modulo 13: an adapter's logprob differs from the base model's at every token.
    return 0 if adapter is None else 1 + sum(map(ord, adapter)) % 12


def answer_within(chars: list[str], limit: int, min_tokens: int) -> tuple[str, FinishReason]:
    """The answer within ``limit`` tokens, before stop strings, and whether the limit ended it."""
    while len(chars) < min_tokens:  # EOS is not allowed yet: the echo goes round again
        chars += chars[: min_tokens - len(chars)]
    # EOS may not come before min_tokens: with min_tokens == max_tokens the limit always ends it.
    limited = len(chars) > limit or min_tokens >= max(1, limit)
    return "".join(chars[:limit]), "length" if limited else "stop"


def cut_at_stop(out: str, finish: FinishReason, params: SamplingParams) -> tuple[str, FinishReason]:
    """``out`` cut at its first stop string; a stop string ends a completion only once min_tokens are out."""
    min_tokens = params.min_tokens or 0
    ends = [out.find(s, max(0, min_tokens - len(s))) for s in params.stop]
    cut = min((i for i in ends if i >= 0), default=-1)
    return (out[:cut], "stop") if cut >= 0 else (out, finish)


def echo_logprobs(prompt: str, generated: str, params: SamplingParams) -> tuple[float, ...] | None:
    """The generated tokens' logprobs, when ``params`` asks for them."""
    if not params.logprobs:
        return None
    return tuple(_token_logprob(p, c) for p, c in zip(prompt[-1:] + generated, generated, strict=False))


def tool_call(request: GenerationRequest, text: str, backend: str) -> ToolCall | None:
    """The call every completion makes, by the rule in the module docstring, or ``None``."""
    if not request.tools or request.tool_choice == "none":
        return None
    if request.tool_choice == "auto":
        last = content_text(request.prompt[-1]["content"])  # type: ignore[index]  # tools need chat
        tool = next((t for t in request.tools if t.name in last), None)
    elif request.tool_choice == "required":
        tool = request.tools[0]
    else:
        tool = next(t for t in request.tools if t.name == request.tool_choice)
    if tool is None:
        return None
    try:
        arguments = minimal_json(tool.parameters)
    except NoMatchError as exc:
        raise RequestRejectedError(
            f"mock: tool {tool.name!r}: {exc}", backend=backend, request_id=request.request_id
        ) from exc
    return ToolCall(f"call_{hashlib.sha256(text.encode()).hexdigest()[:8]}", tool.name, arguments)


def constrained_text(request: GenerationRequest, backend: str) -> str | None:
    """The one text a ``regex`` or ``json_schema`` request gets, or ``None`` without a constraint."""
    params = request.params
    try:
        if params.regex is not None:
            text = minimal_regex_match(params.regex)
        elif params.json_schema is not None:
            text = minimal_json(params.json_schema)
        else:
            return None
    except NoMatchError as exc:
        raise RequestRejectedError(f"mock: {exc}", backend=backend, request_id=request.request_id) from exc
    if len(text) < (params.min_tokens or 0):
        raise RequestRejectedError(
            f"mock: the constrained text {text!r} is shorter than min_tokens={params.min_tokens}",
            backend=backend,
            request_id=request.request_id,
        )
    return text


def score(context: str, continuation: str, adapter: str | None = None) -> tuple[float, ...]:
    """Each continuation token's logprob, given the token before it (the context's last, or a newline)."""
    previous = (context or "\n")[-1] + continuation[:-1]
    salt = _adapter_salt(adapter)
    return tuple(_token_logprob(p, c, salt) for p, c in zip(previous, continuation, strict=True))
