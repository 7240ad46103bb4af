"""What the response cache stores and under which key: fingerprints, keys, and results as JSON.

A key is the SHA-256 of the backend's fingerprint and the canonical request without its id; a result is
its dataclass as compact JSON (read back with the request's own id). A provider batch's record also keeps
its requests (`encode_request`), so that whichever later run collects the batch can read every answer in it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import json.encoder
import operator
from collections.abc import Callable, Mapping
from typing import Any

from ._chat import Tool, image_digest
from ._protocol import AsyncBackend, SupportsFingerprint
from ._sampling_params import SamplingParams
from ._types import (
    Completion,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodResult,
    Request,
    Result,
    ToolCall,
)

__all__ = [
    "backend_fingerprint",
    "decode_request",
    "decode_result",
    "encode_request",
    "encode_result",
    "Keyer",
    "fingerprint_key",
    "plain",
    "request_key",
]


def backend_fingerprint(backend: AsyncBackend) -> Mapping[str, Any]:
    """What identifies a backend's outputs: its ``fingerprint`` (`SupportsFingerprint`), else its name.

    Adapters whose outputs depend on a model or options expose ``fingerprint`` (a JSON-able mapping, with
    no secret in it); two backends with equal fingerprints must give equal results for equal requests.
    """
    fingerprint = backend.fingerprint if isinstance(backend, SupportsFingerprint) else None
    if fingerprint is None:
        return {"name": backend.name}
    return dict(fingerprint)


def request_key(backend: AsyncBackend, request: Request) -> str:
    """The cache key of ``request`` sent to ``backend``: a SHA-256 hex digest, without the request id."""
    return Keyer(backend)(request)


class Keyer:
    """Cache keys of one backend's requests, its fingerprint serialised and hashed once.

    The digest is of ``json.dumps([fingerprint, canonical request], sort_keys=True, default=str)``, the
    form every cache file holds; written as two halves so the fingerprint's is hashed once per run, not
    once per request. A text or token prompt's request is written out directly (keys in sorted order, as
    ``sort_keys`` writes them), its params serialised once per distinct params: requests of one eval share
    equal ones, and the params are most of the work.
    """

    __slots__ = ("_last", "_params", "_prefix")

    def __init__(self, backend: AsyncBackend) -> None:
        fingerprint = json.dumps(backend_fingerprint(backend), sort_keys=True, default=str)
        self._prefix = hashlib.sha256(f"[{fingerprint}, ".encode())
        self._params: dict[SamplingParams, str] = {}
        # The last params written, by identity: an eval's requests usually share one params object, and
        # hashing a SamplingParams (every field) to find it by value costs more than the rest of the key.
        self._last: tuple[SamplingParams, str] | None = None

    def __call__(self, request: Request) -> str:
        digest = self._prefix.copy()
        text = self._generation(request) if type(request) is GenerationRequest else None
        if text is None:
            text = json.dumps(_canonical_request(request), sort_keys=True, default=str)
        digest.update(text.encode())
        digest.update(b"]")
        return digest.hexdigest()

    def _generation(self, request: GenerationRequest) -> str | None:
        """The canonical JSON of a text or token prompt's request; ``None`` for chat (the general path)."""
        prompt = request.prompt
        if not _DIRECT or not (type(prompt) is str or (prompt and type(prompt[0]) is int)):
            return None
        params = request.params
        last = self._last
        written = last[1] if last is not None and last[0] is params else self._params_json(params)
        # sort_keys order: "adapter" (written only when set) comes before "params".
        adapter = "" if request.adapter is None else f'"adapter": {json.dumps(request.adapter)}, '
        # A str prompt quoted by the function json.dumps calls for one (the same text, without the
        # encoder json.dumps builds per call); token ids through json.dumps.
        quoted = _quote(prompt) if type(prompt) is str else json.dumps(prompt)
        text = f'{{{adapter}"params": {written}, "prompt": {quoted}'
        if request.tool_choice != "auto":
            text += f', "tool_choice": {json.dumps(request.tool_choice)}'
        if request.tools:
            text += f', "tools": {json.dumps(_plain_tools(request.tools), sort_keys=True, default=str)}'
        return text + ', "type": "GenerationRequest"}'

    def _params_json(self, params: SamplingParams) -> str:
        """``params`` as sort_keys JSON, kept by value (the last one also by identity, `_last`)."""
        # By value: equal params write equal JSON (their numbers are normalised when built), except in a
        # JSON Schema, where 1 == 1.0 but each is written as given: those are not kept.
        if params.json_schema is not None:
            return json.dumps(plain(params), sort_keys=True, default=str)
        written = self._params.get(params)
        if written is None:
            if len(self._params) >= _PARAMS_KEPT:
                self._params.clear()
            written = self._params[params] = json.dumps(plain(params), sort_keys=True, default=str)
        self._last = (params, written)
        return written


_PARAMS_KEPT = 256
_quote = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str (ensure_ascii)
# The direct path writes exactly these fields; a field added to the request type falls back to the general
# path (which writes every field) until the direct one is taught it.
_DIRECT = tuple(f.name for f in dataclasses.fields(GenerationRequest)) == (
    "prompt",
    "params",
    "request_id",
    "tools",
    "tool_choice",
    "adapter",
)


def fingerprint_key(backend: AsyncBackend) -> str:
    return hashlib.sha256(
        json.dumps(backend_fingerprint(backend), sort_keys=True, default=str).encode()
    ).hexdigest()


def _canonical_request(request: Request) -> dict[str, Any]:
    data: dict[str, Any] = plain(request)
    data.pop("request_id", None)
    data["type"] = type(request).__name__
    if data.get("adapter") is None:
        # Left out when unset (the base model), so every key is what it was before adapters existed.
        data.pop("adapter", None)
    if isinstance(request, GenerationRequest):
        # Left out at their defaults, so a text request's key is what it was before tools existed.
        if not request.tools:
            data.pop("tools")
        else:
            data["tools"] = _plain_tools(request.tools)
        if request.tool_choice == "auto":
            data.pop("tool_choice")
        if request.images:
            data["prompt"] = [_hash_images(m) for m in data["prompt"]]
    return data


def _plain_tools(tools: Any) -> list[Any]:
    # A tool's `strict` is left out when unset, so a tool request's key is what it was before the field.
    written = []
    for tool in plain(tools):
        if tool.get("strict") is None:
            tool.pop("strict", None)
        written.append(tool)
    return written


def _hash_images(message: dict[str, Any]) -> dict[str, Any]:
    # An image counts by its content: the same bytes key the same however the data URL was written.
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return {
        **message,
        "content": [
            {**p, "image_url": {**p["image_url"], "url": "sha256:" + image_digest(p["image_url"]["url"], 64)}}
            if p.get("type") == "image_url"
            else p
            for p in content
        ],
    }


_SCALARS = (str, int, float, bool, type(None))
_FIELDS: dict[type, tuple[str, ...] | None] = {}


def plain(value: Any) -> Any:
    """``value`` with dataclasses as dicts, serialised by ``json.dumps`` as `dataclasses.asdict`'s copy is.

    `dataclasses.asdict` deep-copies every value; JSON needs none of that, and skipping it makes keys and
    stored results several times cheaper (tuples of scalars, such as token ids, are passed through whole).
    """
    kind = type(value)
    if kind in _SCALARS:
        return value
    try:
        fields = _FIELDS[kind]
    except KeyError:
        fields = _FIELDS[kind] = (
            tuple(f.name for f in dataclasses.fields(kind)) if dataclasses.is_dataclass(kind) else None
        )
    if fields is not None:
        data = {}
        for name in fields:
            field = getattr(value, name)
            data[name] = field if type(field) in _SCALARS else plain(field)
        return data
    if kind is tuple or kind is list:
        if not value or type(value[0]) in _SCALARS:
            return value
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _jsonable(value: object) -> object:
    # Engines hand out numpy scalars; the result types accept anything int- or float-like in a tuple.
    if hasattr(value, "__index__"):
        return operator.index(value)
    if hasattr(value, "__float__"):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_result(result: Result) -> tuple[str, str]:
    if type(result) is GenerationResult and _DIRECT_RESULTS:
        data: Any = {
            "request_id": result.request_id,
            "completions": [_completion_data(c) for c in result.completions],
            "prompt_tokens": result.prompt_tokens,
            "model": result.model,
            "generated_tokens": result.generated_tokens,
            "cached_prompt_tokens": result.cached_prompt_tokens,
        }
    else:
        data = plain(result)
    return type(result).__name__, _dumps(data)


def _compact_dumps() -> Callable[[Any], str]:
    """``json.dumps(data, separators=(",", ":"), default=_jsonable)``, with one encoder for every result.

    `json.JSONEncoder.encode` builds a new C encoder for each call (a fifth of a result's encoding here);
    the cache's writer encodes every result it stores, on the thread that shares the GIL with the loop. No
    cycle check: a result is a tree. Where the C encoder is missing (not CPython), the plain encoder.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.JSONEncoder(separators=(",", ":"), default=_jsonable).encode
    encoder = make(None, _jsonable, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)

    def dumps(data: Any) -> str:
        return "".join(encoder(data, 0))

    return dumps


_dumps = _compact_dumps()


def _completion_data(c: Completion) -> dict[str, Any]:
    return {
        "text": c.text,
        "token_ids": c.token_ids,
        "logprobs": c.logprobs,
        "finish_reason": c.finish_reason,
        "tool_calls": [plain(call) for call in c.tool_calls] if c.tool_calls else [],
        "reasoning": c.reasoning,
        "reasoning_tokens": c.reasoning_tokens,
        "reasoning_truncated": c.reasoning_truncated,
        "token_texts": c.token_texts,
    }


# The direct path writes exactly these fields; a field added to a result type is written by `plain` (every
# field) until the direct one is taught it.
_DIRECT_RESULTS = tuple(f.name for f in dataclasses.fields(GenerationResult)) == (
    "request_id",
    "completions",
    "prompt_tokens",
    "model",
    "generated_tokens",
    "cached_prompt_tokens",
) and tuple(f.name for f in dataclasses.fields(Completion)) == (
    "text",
    "token_ids",
    "logprobs",
    "finish_reason",
    "tool_calls",
    "reasoning",
    "reasoning_tokens",
    "reasoning_truncated",
    "token_texts",
)


def _completion(c: dict[str, Any]) -> Completion:
    calls, texts, logprobs = c.get("tool_calls"), c.get("token_texts"), c["logprobs"]
    return Completion(
        c["text"],
        tuple(c["token_ids"]),
        None if logprobs is None else tuple(logprobs),
        c["finish_reason"],
        tuple(ToolCall(**call) for call in calls) if calls else (),
        c.get("reasoning"),
        c.get("reasoning_tokens", 0),
        c.get("reasoning_truncated", False),
        tuple(texts) if texts else (),
    )


def _tuple(values: Any) -> tuple[Any, ...] | None:
    return None if values is None else tuple(values)


_decoder = json.JSONDecoder()


def decode_result(kind: str, value: str, request_id: str | None) -> Result:
    # raw_decode: the scanner without json.loads' two whitespace matches per call (a resume decodes one
    # result per request). What it does not take as a whole (bytes, whitespace around the JSON: a file
    # written by another tool) goes to json.loads, which accepts what it accepted before or says why not.
    try:
        data, end = _decoder.raw_decode(value)
        whole = end == len(value)
    except (ValueError, TypeError):
        whole = False
    if not whole:
        data = json.loads(value)
    if kind == "GenerationResult":
        # Positional and without empty generators: a resume decodes one result per request.
        return GenerationResult(
            request_id,
            tuple(map(_completion, data["completions"])),
            data.get("prompt_tokens"),
            data.get("model"),
            data.get("generated_tokens"),
            data.get("cached_prompt_tokens"),  # usage stored with the result: a resumed run's ledger is whole
        )
    if kind == "LoglikelihoodResult":
        data["request_id"] = request_id
        data["token_logprobs"] = _tuple(data.get("token_logprobs"))
        return LoglikelihoodResult(**data)
    raise ValueError(f"unknown result kind {kind!r}")


def encode_request(request: GenerationRequest) -> dict[str, Any]:
    """``request`` as JSON-able data, whole (id included), for a provider batch's record."""
    return dataclasses.asdict(request)


def decode_request(data: Mapping[str, Any]) -> GenerationRequest:
    """The request `encode_request` wrote (JSON lists read back as the tuples the types hold)."""
    params: dict[str, Any] = {k: tuple(v) if k == "stop" else v for k, v in data["params"].items()}
    return GenerationRequest(
        data["prompt"],
        SamplingParams(**params),
        request_id=data.get("request_id"),
        tools=tuple(Tool(**tool) for tool in data.get("tools") or ()),
        tool_choice=data.get("tool_choice", "auto"),
    )
