"""TGI's native wire format for the ``tgi`` adapter: ``/info``, request bodies and response parsing.

How `SamplingParams` map onto TGI's parameters is told in `asyncbackends.adapters.tgi`'s docstring.

Pure functions, no I/O. The parsers raise ``KeyError``, ``TypeError``, ``AttributeError`` (and, for the
chat route, ``IndexError`` or ``ValueError``) on a body that is not what TGI promises; the adapter turns
those into a malformed-response `BackendError` with the request's id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..._sampling_table import OPTIONAL_SPECS, SPECS
from ..._types import Completion, GenerationRequest, Request, ToolCall
from ...errors import InvalidRequestError

__all__ = [
    "DEFAULT_PAYLOAD_LIMIT",
    "HONOURED",
    "MARKDOWN_IMAGE",
    "NOT_ON_CHAT",
    "UNSUPPORTED_REASONS",
    "TGIInfo",
    "adapter_fields",
    "chat_payload",
    "encoder",
    "generate_payload",
    "int_header",
    "length_problem",
    "oversized",
    "parse_chat",
    "parse_generate",
    "parse_lora_adapters",
    "sampling_parameters",
]

DEFAULT_PAYLOAD_LIMIT = 2_000_000
"""TGI's default ``--payload-limit`` in bytes: a larger body is answered 413 without reaching the model."""

MARKDOWN_IMAGE = re.compile(r"!\[\]\([^)]*\)")
"""An image in a text prompt as TGI's router finds it in a vision model's ``inputs``: ``![](url)``."""

_FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}
# The optional parameters sent as they are (the table's plain renames), on /generate and on the chat route.
_GENERATE_FIELDS = tuple((s.name, s.tgi) for s in OPTIONAL_SPECS if s.tgi)
_CHAT_FIELDS = tuple((s.name, s.tgi_chat) for s in OPTIONAL_SPECS if s.tgi_chat)
HONOURED: tuple[str, ...] = (*(name for name, _ in _GENERATE_FIELDS), "json_schema", "regex")
"""The optional sampling parameters TGI honours: its plain renames, and structured output as its grammar."""
NOT_ON_CHAT: tuple[str, ...] = tuple(name for name, _ in _GENERATE_FIELDS if not SPECS[name].tgi_chat)
"""The optional parameters ``/generate`` takes and TGI's chat route has no field for."""
UNSUPPORTED_REASONS = {
    **{s.name: f"TGI has no {s.name}" for s in OPTIONAL_SPECS if s.needs_logits and not s.tgi},
    "presence_penalty": "TGI has none (its chat route turns presence_penalty into a repetition penalty)",
    "min_tokens": "TGI has no minimum length",
}
"""Why TGI cannot honour these optional sampling parameters, for the refusal's message."""


@dataclass(frozen=True, slots=True)
class TGIInfo:
    """What ``GET /info`` says about the server (fields TGI does not report are ``None``)."""

    model_id: str | None = None
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_stop_sequences: int | None = None
    max_concurrent_requests: int | None = None
    version: str | None = None
    model_sha: str | None = None
    model_dtype: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TGIInfo:
        """Parse ``/info``; TGI < 2.0 named ``max_input_tokens`` ``max_input_length``."""

        def num(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) else None

        return cls(
            model_id=text("model_id"),
            model_sha=text("model_sha"),
            model_dtype=text("model_dtype"),
            max_input_tokens=num("max_input_tokens") or num("max_input_length"),
            max_total_tokens=num("max_total_tokens"),
            max_stop_sequences=num("max_stop_sequences"),
            max_concurrent_requests=num("max_concurrent_requests"),
            version=text("version"),
        )


def sampling_parameters(params: Any) -> dict[str, Any]:
    """``/generate``'s sampling ``parameters``: greedy or sampling, penalties and the grammar."""
    out: dict[str, Any] = {"do_sample": False}
    if not params.greedy:
        out = {"do_sample": True, "temperature": params.temperature}
        if params.top_k is not None:
            out["top_k"] = params.top_k
        if params.top_p < 1.0:
            out["top_p"] = params.top_p
    # Penalties are not warpers: TGI applies them in greedy mode too without turning sampling on.
    for name, key in _GENERATE_FIELDS:
        if getattr(params, name) is not None:
            out[key] = getattr(params, name)
    grammar = _grammar(params)
    if grammar is not None:
        out["grammar"] = grammar
    return out


def generate_payload(request: GenerationRequest, seed: int | None) -> dict[str, Any]:
    """The body of ``POST /generate`` for one sequence of a text prompt."""
    params = request.params
    parameters = sampling_parameters(params)
    parameters.update(max_new_tokens=params.max_tokens, return_full_text=False, details=True)
    if params.stop:
        parameters["stop"] = list(params.stop)
    if seed is not None:
        parameters["seed"] = seed
    parameters.update(adapter_fields(request))
    return {"inputs": request.prompt, "parameters": parameters}


def adapter_fields(request: Request) -> dict[str, Any]:
    """``/generate``'s ``parameters.adapter_id`` for a request naming an adapter; nothing for the base."""
    return {} if request.adapter is None else {"adapter_id": request.adapter}


def parse_lora_adapters(value: str) -> tuple[str, ...]:
    """The adapter ids in a ``--lora-adapters`` / ``LORA_ADAPTERS`` value, as TGI's server parses it.

    Comma-separated ``id``, ``id=path`` or ``id@revision`` entries (TGI's ``parse_lora_adapters``,
    server/text_generation_server/utils/adapter.py); the id is what a request names as ``adapter_id``.

    Raises:
        ValueError: An entry TGI would refuse (more than one ``=`` or ``@``, or no id).
    """
    ids = []
    for entry in (part.strip() for part in value.split(",")):
        match = _LORA_ADAPTER.match(entry)
        if entry.count("=") > 1 or entry.count("@") > 1 or match is None:
            raise ValueError(f"Invalid LoRA adapter format: {entry}")
        ids.append(match.group(1))
    return tuple(ids)


_LORA_ADAPTER = re.compile(r"^([^=@]+)(?:=([^@]+))?(?:@(.+))?$")  # TGI's own pattern


def parse_generate(body: Any, params: Any) -> Completion:
    """The completion in a ``/generate`` answer (stop sequence stripped, finish reason mapped)."""
    text: str = body["generated_text"]
    details = body.get("details") or {}
    tokens = details.get("tokens") or []
    reason = str(details.get("finish_reason"))
    if reason == "stop_sequence":
        text = _strip_stop(text, params.stop)
    logprobs = tuple(t["logprob"] for t in tokens) if params.logprobs else None
    if logprobs is not None and any(lp is None for lp in logprobs):
        logprobs = None
    texts = tuple(t["text"] for t in tokens) if logprobs is not None else ()
    return Completion(
        text, tuple(t["id"] for t in tokens), logprobs, _FINISH.get(reason, reason), token_texts=texts
    )


def chat_payload(request: GenerationRequest, seed: int | None) -> dict[str, Any]:
    """The body of ``POST /v1/chat/completions`` for one sequence of a chat prompt."""
    params = request.params
    payload: dict[str, Any] = {
        "messages": [_message(m) for m in request.prompt if isinstance(m, Mapping)],
        "max_tokens": params.max_tokens,
        # TGI's chat route reads temperature 0 as greedy (do_sample false), unlike /generate.
        "temperature": params.temperature,
    }
    if params.top_p < 1.0 and not params.greedy:
        payload["top_p"] = params.top_p
    for name, key in _CHAT_FIELDS:
        if getattr(params, name) is not None:
            payload[key] = getattr(params, name)
    grammar = _grammar(params)
    if grammar is not None:
        payload["response_format"] = grammar
    if params.stop:
        payload["stop"] = list(params.stop)
    if seed is not None:
        payload["seed"] = seed
    if params.logprobs:
        payload["logprobs"] = True
    if request.adapter is not None:
        # TGI's router reads the chat request's model as the adapter id (any name but "tgi"; router/src/
        # lib.rs, ChatRequest's try_into_generate), though its OpenAPI spec calls the field unused.
        payload["model"] = request.adapter
    if request.tools:
        # TGI's FunctionDefinition names the schema ``arguments`` (it reads ``parameters`` as an alias).
        payload["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "arguments": t.parameters},
            }
            for t in request.tools
        ]
        choice = request.tool_choice
        payload["tool_choice"] = (
            choice if choice in ("auto", "none", "required") else {"function": {"name": choice}}
        )
    return payload


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    # TGI's MessageBody is oneOf content | tool_calls: an assistant's calls go without its (empty) content.
    out = dict(message)
    if out.get("tool_calls") and not out.get("content"):
        out.pop("content", None)
    return out


def parse_chat(body: Any, params: Any) -> tuple[Completion, Any]:
    """The completion in a chat answer, and the answer's ``usage`` (``{}`` where it has none)."""
    choice = body["choices"][0]
    text = choice["message"].get("content") or ""
    logprobs = None
    texts: tuple[str, ...] = ()
    if params.logprobs and choice.get("logprobs"):
        content = choice["logprobs"]["content"]
        logprobs = tuple(float(t["logprob"]) for t in content)
        texts = tuple(t["token"] for t in content)  # the chat route names tokens by text only
    usage = body.get("usage") or {}
    calls = tuple(ToolCall.from_openai(call) for call in choice["message"].get("tool_calls") or ())
    completion = Completion(text, (), logprobs, choice.get("finish_reason"), calls, token_texts=texts)
    return completion, usage


def _grammar(params: Any) -> dict[str, Any] | None:
    """TGI's ``GrammarType`` for the request's structured-output constraint, if any."""
    if params.json_schema is not None:
        return {"type": "json", "value": dict(params.json_schema)}
    if params.regex is not None:
        return {"type": "regex", "value": params.regex}
    return None


def _strip_stop(text: str, stops: Sequence[str]) -> str:
    # TGI's text ends with the stop sequence that ended it; ours never includes it.
    for stop in sorted(stops, key=len, reverse=True):
        if text.endswith(stop):
            return text[: -len(stop)]
    return text


def int_header(headers: Mapping[str, str], name: str) -> int | None:
    """A header's integer value; ``None`` where it is missing or not an integer."""
    value = headers.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def oversized(payload: Any, limit: int | None) -> str | None:
    """Why ``payload`` (encoded as the transport sends it) is over the payload ``limit``; ``None`` if not."""
    if limit is None:
        return None
    size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())
    if size <= limit:
        return None
    return (
        f"the request body is {size:,} bytes, over the server's payload limit ({limit:,} bytes, TGI's "
        "--payload-limit): send smaller images, or set payload_limit to the server's"
    )


def length_problem(
    info: TGIInfo,
    inputs: str,
    max_new: int,
    encode: Callable[[str], Sequence[int]] | None,
    prompt_min: int = 1,
) -> str | None:
    """Why TGI's router would refuse ``inputs`` + ``max_new`` tokens for length; ``None`` if it would not.

    Without ``encode`` the prompt counts as ``prompt_min`` tokens. Markdown images are left out of the count:
    the router counts each as the model's image tokens, unknown here, so with images it is a lower bound.
    """
    if info.max_total_tokens is None:
        return None
    text, images = MARKDOWN_IMAGE.subn("", inputs)
    n_prompt = len(encode(text)) if encode is not None else prompt_min
    at_least = "" if encode is not None and not images else " at least"
    if info.max_input_tokens is not None and n_prompt > info.max_input_tokens:
        return (
            f"the prompt has{at_least} {n_prompt} tokens; this server accepts at most {info.max_input_tokens}"
        )
    if n_prompt + max_new > info.max_total_tokens:
        return (
            f"prompt tokens ({n_prompt}{at_least}) + max_tokens ({max_new}) "
            f"exceed this server's max_total_tokens ({info.max_total_tokens})"
        )
    return None


def encoder(tokenizer: Any) -> Callable[[str], Sequence[int]] | None:
    """The ``text -> token ids`` function of a ``tokenizer`` option (an ``encode`` method, or a callable)."""
    if tokenizer is None:
        return None
    encode = getattr(tokenizer, "encode", None)
    if callable(encode):
        return encode  # type: ignore[no-any-return]
    if callable(tokenizer):
        return tokenizer  # type: ignore[no-any-return]
    raise InvalidRequestError("tokenizer must have an encode(text) method or be a callable text -> token ids")
