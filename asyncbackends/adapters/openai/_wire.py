"""The OpenAI-compatible wire format of the ``openai`` adapter: request bodies and response parsing.

Optional sampling parameters: the table's ``openai`` names (`asyncbackends._sampling_table`) go to every
server; ``json_schema`` is OpenAI's ``response_format`` ``{"type": "json_schema", "json_schema": {"name",
"schema", "strict": true}}``. A vLLM server also takes its extra fields (the table's ``openai_vllm`` names),
and structured output as its ``structured_outputs`` (``{"json": schema}`` or ``{"regex": ...}``, exactly the
in-process adapter's ``StructuredOutputsParams``). Any other server refuses those (`VLLM_SERVER_ONLY`).

Reasoning: ``reasoning_effort`` is OpenAI's chat field of that name (chat prompts only: the completions API
has none); ``thinking_budget`` is vLLM's extra field ``thinking_token_budget`` (refused elsewhere). A choice's
thinking is read from ``reasoning_content`` (DeepSeek, older vLLM) or ``reasoning`` (vLLM 0.1x+,
OpenRouter-style servers), on the message of a chat choice or on a completions choice where a server puts it.
A choice cut off (``"length"``) with thinking and no answer is `Completion.reasoning_truncated`.

Chat: messages go as they are (OpenAI's shape: content parts, an assistant's ``tool_calls``, ``role:
"tool"`` messages); tools as ``tools`` entries ``{"type": "function", "function": {...}}``;
``tool_choice`` ``"auto"``, ``"none"``, ``"required"``, or a named tool as ``{"type": "function",
"function": {"name": ...}}``.
A choice's ``message.tool_calls`` come back as `ToolCall`.

Pure functions, no I/O. The parsers raise ``KeyError``, ``TypeError``, ``IndexError``, ``ValueError`` or
``AttributeError`` on a body that is not what the API promises; the adapter turns those into a
malformed-response `BackendError` with the request's id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..._routing.choice import prefix_digest
from ..._sampling_table import OPTIONAL_SPECS
from ..._types import Capabilities, Completion, GenerationRequest, SamplingParams, ToolCall
from .._scoring import ScoringPlan

__all__ = [
    "PROMPT_CACHE_HOSTS",
    "VLLM_SERVER_ONLY",
    "capabilities",
    "completion_payload",
    "optional_fields",
    "echo_payload",
    "cached_prompt_tokens",
    "parse_completions",
    "sends_prompt_cache_key",
    "parse_echo",
    "tool_fields",
]


_EVERY_SERVER = tuple((s.name, s.openai) for s in OPTIONAL_SPECS if s.openai)
_VLLM_FIELDS = tuple((s.name, s.openai_vllm) for s in OPTIONAL_SPECS if s.openai_vllm)
VLLM_SERVER_ONLY: tuple[str, ...] = (*(name for name, _ in _VLLM_FIELDS), "regex")
"""The optional parameters only a vLLM server honours: its extra fields, and ``regex`` (structured output)."""


PROMPT_CACHE_HOSTS = ("openai.com", "openai.azure.com")
"""Hosts (and their subdomains) whose API takes ``prompt_cache_key``; other servers may refuse the field."""


def sends_prompt_cache_key(base_url: str) -> bool:
    """Whether a server at ``base_url`` takes ``prompt_cache_key`` (OpenAI's own API, Azure's)."""
    host = (urlsplit(base_url).hostname or "").lower()
    return any(host == h or host.endswith("." + h) for h in PROMPT_CACHE_HOSTS)


def completion_payload(
    model: str, request: GenerationRequest, *, vllm: bool, cache_key: bool = False
) -> dict[str, Any]:
    """The body of ``/completions`` (text and token-id prompts) or ``/chat/completions`` (chat).

    With ``cache_key``, ``prompt_cache_key`` names the prompt's opening (`prefix_digest`, the router's
    affinity key): OpenAI routes requests that share it to one prompt cache.
    """
    params = request.params
    chat = request.prompt_kind == "chat"
    payload: dict[str, Any] = {"model": model, "max_tokens": params.max_tokens}
    if chat:
        payload["messages"] = [dict(m) for m in request.prompt if isinstance(m, Mapping)]
    else:
        payload["prompt"] = request.prompt if isinstance(request.prompt, str) else list(request.prompt)
    payload["temperature"] = params.temperature
    if params.top_p < 1.0:
        payload["top_p"] = params.top_p
    if params.top_k is not None:
        payload["top_k"] = params.top_k  # an extension (vLLM, SGLang); OpenAI itself refuses it
    if params.n != 1:
        payload["n"] = params.n
    if params.seed is not None:
        payload["seed"] = params.seed
    if params.stop:
        payload["stop"] = list(params.stop)
    if params.logprobs:
        payload["logprobs"] = True if chat else 0
    payload.update(optional_fields(params, vllm=vllm))
    payload.update(tool_fields(request))
    if vllm:
        payload["return_token_ids"] = True
    if cache_key:
        digest = prefix_digest(request)
        if digest is not None:
            payload["prompt_cache_key"] = digest
    return payload


def tool_fields(request: GenerationRequest) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` as OpenAI defines them; nothing when the request offers no tools."""
    if not request.tools:
        return {}
    choice: Any = request.tool_choice
    if choice not in ("auto", "none", "required"):
        choice = {"type": "function", "function": {"name": choice}}
    return {"tools": [tool.to_openai() for tool in request.tools], "tool_choice": choice}


def optional_fields(params: SamplingParams, *, vllm: bool) -> dict[str, Any]:
    """The request fields of the optional sampling parameters that are set (refused ones checked before)."""
    # Plain renames from the table, every server's first (the order the bodies have always had).
    fields: dict[str, Any] = {}
    for fields_of_server in (_EVERY_SERVER, _VLLM_FIELDS) if vllm else (_EVERY_SERVER,):
        for name, key in fields_of_server:
            if getattr(params, name) is not None:
                fields[key] = getattr(params, name)
    if vllm:
        if params.json_schema is not None:
            fields["structured_outputs"] = {"json": dict(params.json_schema)}
        elif params.regex is not None:
            fields["structured_outputs"] = {"regex": params.regex}
    elif params.json_schema is not None:
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": dict(params.json_schema), "strict": True},
        }
    return fields


def parse_completions(
    body: Any, *, chat: bool, logprobs: bool
) -> tuple[tuple[Completion, ...], int | None, int | None, str | None]:
    """The completions in ``index`` order, the prompt's and their token counts, and the model that answered.

    The counts are the server's ``usage`` (``None`` where it gives none).
    """
    choices = sorted(body["choices"], key=lambda c: c.get("index", 0))
    completions = tuple(_completion(c, chat, logprobs) for c in choices)
    usage = body.get("usage") or {}
    spent = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    if len(completions) == 1 and isinstance(spent, int) and spent > 0:  # usage counts all choices together
        completions = (dataclasses.replace(completions[0], reasoning_tokens=spent),)
    return completions, usage.get("prompt_tokens"), usage.get("completion_tokens"), body.get("model") or None


def cached_prompt_tokens(body: Any) -> int | None:
    """Prompt tokens the server read from its cache (``usage.prompt_tokens_details.cached_tokens``).

    OpenAI reports it on every answer (0 when nothing was cached); ``vllm serve`` only when started with
    ``--enable-prompt-tokens-details``. ``None`` where the server says nothing.
    """
    details = ((body.get("usage") or {}).get("prompt_tokens_details")) or {}
    cached = details.get("cached_tokens")
    return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0 else None


def _completion(choice: Mapping[str, Any], chat: bool, want_logprobs: bool) -> Completion:
    text = (choice["message"].get("content") or "") if chat else choice["text"]
    logprobs = None
    texts: tuple[str, ...] = ()
    lp = choice.get("logprobs")
    if want_logprobs and lp:
        values = [t["logprob"] for t in lp["content"]] if chat else lp["token_logprobs"]
        if all(v is not None for v in values):
            logprobs = tuple(float(v) for v in values)
            # The server names each token by its text: kept, since most servers send no token ids.
            texts = tuple(t["token"] for t in lp["content"]) if chat else tuple(lp["tokens"])
    token_ids = tuple(int(t) for t in choice.get("token_ids") or ())
    calls = (choice["message"].get("tool_calls") or ()) if chat else ()
    tool_calls = tuple(ToolCall.from_openai(call) for call in calls)
    holder = choice["message"] if chat else choice
    reasoning = holder.get("reasoning_content")
    reasoning = holder.get("reasoning") if reasoning is None else reasoning
    if reasoning is not None and not isinstance(reasoning, str):
        raise TypeError(f"reasoning is not a string: {type(reasoning).__name__}")
    finish = choice.get("finish_reason")
    # Cut off while thinking: no answer, never the thought as the answer.
    truncated = bool(reasoning) and finish == "length" and not text and not tool_calls
    return Completion(
        text,
        token_ids,
        logprobs,
        finish,
        tool_calls,
        reasoning=reasoning,
        reasoning_truncated=truncated,
        token_texts=texts,
    )


def echo_payload(model: str, plan: ScoringPlan) -> dict[str, Any]:
    """VLLM's scoring request: the token-id prompt echoed with each token's logprob and top-1 alternative."""
    return {
        "model": model,
        "prompt": list(plan.token_ids),
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
        "temperature": 0.0,
        "return_tokens_as_token_ids": True,
    }


def parse_echo(body: Any, plan: ScoringPlan) -> list[tuple[float, bool]]:
    """Each scored token's (logprob, is it the top-1 token) from the echoed prompt logprobs."""
    lp = body["choices"][0]["logprobs"]
    tokens, values, tops = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]
    n = len(plan.token_ids)
    if len(tokens) < n or tokens[:n] != [f"token_id:{t}" for t in plan.token_ids]:
        raise ValueError("the echoed tokens are not the prompt's (is this a vLLM server?)")
    scored = []
    for i in range(n - plan.scored, n):
        value = float(values[i])
        top = tops[i] or {}
        scored.append((value, value >= max(top.values(), default=value)))
    return scored


def capabilities(
    server: str, max_concurrency: int | None, *, images: bool = True, tools: bool = True
) -> Capabilities:
    """What a server of this kind can do."""
    # Scoring and token-id prompts need vLLM's echo + /tokenize; every OpenAI server does the rest.
    vllm = server == "vllm"
    return Capabilities(
        loglikelihood=vllm,
        rolling_loglikelihood=vllm,
        is_greedy=vllm,
        n_samples=True,
        seed=True,
        chat=True,
        token_ids=vllm,
        logprobs=True,
        stop=True,
        max_concurrency=max_concurrency,
        # Every parameter a server is sent (the table's plain renames, structured output) is honoured; the
        # vLLM server's extra fields only by a vLLM server (others have none, or ignore them silently).
        **dict.fromkeys((name for name, _ in _EVERY_SERVER), True),
        **dict.fromkeys(VLLM_SERVER_ONLY, vllm),
        json_schema=True,
        # Read where the server gives it (None where it gives none).
        reasoning=True,
        # Claimed unless the caller says otherwise (adapter options): a server that cannot take them answers
        # 400, which comes back as RequestRejectedError.
        images=images,
        tools=tools,
        # An adapter is the request's model: every OpenAI-compatible server takes a model name (vllm serve
        # serves its LoRA modules so); an unknown one is the server's 404 (or refused before sending where
        # lora_modules name the adapters).
        adapters=True,
    )
