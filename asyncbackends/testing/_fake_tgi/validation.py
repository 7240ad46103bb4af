"""TGI's request handling rules, as `FakeTGIServer` applies them (router/src/validation.rs, server.rs).

Two stages, like the router: the body is first deserialised (axum's ``Json`` extractor: a wrong content
type is a plain-text 415, malformed JSON a plain-text 400, a wrong field type a plain-text 422), then
validated (`ValidationError`: a JSON 422 ``{"error": "Input validation error: ...", "error_type":
"validation"}``), in the router's order and with its messages.

``grammar`` (``GrammarType``, serde-tagged by ``type``: ``json``, ``regex`` or ``json_schema``) is checked
as the router does after the length checks: grammar support switched off is ``grammar is not supported``; a
JSON grammar given as a string must parse, must be a valid Draft 2020-12 schema and must have
``properties``, each failure ``grammar is not valid: ...``; a regex is passed on unchecked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Limits", "ValidRequest", "WireError", "chat_to_generate", "parse_body", "validate_generate"]

_DEFAULT_GENERATION_LENGTH = 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """The router's launch options that validation reads (TGI's defaults, smaller totals)."""

    max_input_tokens: int = 4095
    max_total_tokens: int = 4096
    max_best_of: int = 2
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5
    max_concurrent_requests: int = 128
    payload_limit: int = 2_000_000
    grammar_support: bool = True


class WireError(Exception):
    """An error response: status, body (JSON-able or text) and its content type."""

    def __init__(self, status: int, body: Any, *, text: bool = False) -> None:
        super().__init__(status, body)
        self.status, self.body, self.text = status, body, text

    @classmethod
    def json_error(cls, status: int, error: str, error_type: str) -> WireError:
        """TGI's ``ErrorResponse`` body."""
        return cls(status, {"error": error, "error_type": error_type})


def _validation(message: str) -> WireError:
    return WireError.json_error(422, f"Input validation error: {message}", "validation")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_CHECKS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "uint": ("an unsigned integer", lambda v: _is_int(v) and v >= 0),
    "int": ("an integer", _is_int),
    "float": ("a float", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    "bool": ("a boolean", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "strlist": (
        "a sequence of strings",
        lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
    ),
    "any": ("any value", lambda v: True),
    "grammar": ("internally tagged enum GrammarType", lambda v: _grammar_shape(v) is None),
}

_GRAMMAR_TYPES = ("json", "regex", "json_schema")


def _grammar_shape(value: Any) -> str | None:
    """Why serde would refuse ``value`` as a ``GrammarType`` (``None``: it deserialises)."""
    if not isinstance(value, dict):
        return "expected internally tagged enum GrammarType"
    kind = value.get("type")
    if kind not in _GRAMMAR_TYPES:
        return f"unknown variant `{kind}`, expected one of `json`, `regex`, `json_schema`"
    if "value" not in value:
        return "missing field `value`"
    if kind == "regex" and not isinstance(value["value"], str):
        return "invalid type, expected a string"
    if kind == "json_schema" and not (isinstance(value["value"], dict) and "schema" in value["value"]):
        return "missing field `schema`"
    return None


# GenerateParameters' Rust field types; "!" marks a non-Option field (null is a type error there).
GENERATE_PARAMETERS: dict[str, str] = {
    "best_of": "uint",
    "temperature": "float",
    "repetition_penalty": "float",
    "frequency_penalty": "float",
    "top_k": "int",
    "top_p": "float",
    "typical_p": "float",
    "do_sample": "bool!",
    "max_new_tokens": "uint",
    "return_full_text": "bool",
    "stop": "strlist!",
    "truncate": "uint",
    "watermark": "bool!",
    "details": "bool!",
    "decoder_input_details": "bool!",
    "seed": "uint",
    "top_n_tokens": "uint",
    "grammar": "grammar",
    "adapter_id": "str",
}
_DEFAULTS = {
    "do_sample": False,
    "stop": [],
    "watermark": False,
    "details": True,
    "decoder_input_details": False,
}


def parse_body(content_type: str, raw: bytes, limit: int) -> Any:
    """Axum's ``Json`` extractor: content type, size, then syntax; each failure a plain-text error."""
    if len(raw) > limit:
        raise WireError(413, "Failed to buffer the request body: length limit exceeded", text=True)
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise WireError(415, "Expected request with `Content-Type: application/json`", text=True)
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise WireError(400, f"Failed to parse the request body as JSON: {exc}", text=True) from exc


def _type_error(where: str, message: str) -> WireError:
    return WireError(
        422, f"Failed to deserialize the JSON body into the target type: {where}: {message}", text=True
    )


def deserialize_parameters(body: Any, *, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A ``GenerateRequest`` body checked like serde would, with defaults filled in."""
    if not isinstance(body, dict):
        raise _type_error(
            "<root>", f"invalid type: expected struct GenerateRequest, got {type(body).__name__}"
        )
    if "inputs" not in body:
        raise _type_error("<root>", "missing field `inputs`")
    if not isinstance(body["inputs"], str):
        raise _type_error("inputs", "invalid type, expected a string")
    for name, kind in (extra or {}).items():
        value = body.get(name)
        if value is not None and not _CHECKS[kind.rstrip("!")][1](value):
            raise _type_error(name, f"invalid type, expected {_CHECKS[kind.rstrip('!')][0]}")
    params = body.get("parameters")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise _type_error("parameters", "invalid type, expected struct GenerateParameters")
    out = dict(_DEFAULTS)
    for name, value in params.items():
        if name not in GENERATE_PARAMETERS:
            continue  # serde ignores unknown fields here
        kind = GENERATE_PARAMETERS[name]
        required = kind.endswith("!")
        label, check = _CHECKS[kind.rstrip("!")]
        if value is None and not required:
            continue
        if kind == "grammar" and value is not None and _grammar_shape(value) is not None:
            raise _type_error(f"parameters.{name}", str(_grammar_shape(value)))
        if value is None or not check(value):
            raise _type_error(f"parameters.{name}", f"invalid type: {json.dumps(value)}, expected {label}")
        out[name] = value
    return out


@dataclass(frozen=True, slots=True)
class ValidRequest:
    """A request that passed validation, with the router's resolved values."""

    inputs: str
    model_inputs: str
    """What the model reads of ``inputs`` (its images read, as `_fake_tgi.images` tells)."""
    input_length: int
    max_new_tokens: int
    do_sample: bool
    seed: int | None
    stop: list[str]
    best_of: int
    truncate: int | None
    details: bool
    decoder_input_details: bool
    top_n_tokens: int
    return_full_text: bool
    grammar: tuple[str, Any] | None = None
    """``("regex", pattern)`` or ``("json", schema)``: the constraint the router hands to the model."""
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    adapter_id: str | None = None
    """The LoRA adapter asked for (``parameters.adapter_id``; a chat's ``model`` other than ``"tgi"``)."""


def validate_generate(
    inputs: str,
    p: Mapping[str, Any],
    limits: Limits,
    count_tokens: Callable[[str], int],
    *,
    stream: bool = False,
    read_inputs: Callable[[str], str] = str,
) -> ValidRequest:
    """The router's ``Validation::validate`` (and the endpoint checks around it), in its order.

    ``read_inputs`` gives the text the model reads for ``inputs`` (where a vision model's router reads the
    images in it, raising `WireError` for one it refuses); its tokens are the input length.
    """
    best_of = p.get("best_of", 1)
    if best_of != 1:
        if limits.max_best_of == 1:
            raise _validation("`best_of` != 1 is not allowed for this endpoint")
        if best_of == 0 or best_of > limits.max_best_of:
            raise _validation(f"`best_of` must be > 0 and <= {limits.max_best_of}. Given: {best_of}")
        if stream:
            raise _validation("`best_of` != 1 is not supported when streaming tokens")
    if stream and p.get("decoder_input_details"):
        raise _validation("`decoder_input_details` == true is not supported when streaming tokens")
    sampling = p["do_sample"] or any(
        p.get(k) is not None for k in ("temperature", "top_k", "top_p", "typical_p")
    )
    if best_of > 1 and not sampling:
        raise _validation("you must use sampling when `best_of` is > 1")
    if p.get("temperature", 1.0) <= 0:
        raise _validation("`temperature` must be strictly positive")
    if p.get("repetition_penalty", 1.0) <= 0:
        raise _validation("`repetition_penalty` must be strictly positive")
    if not -2.0 <= p.get("frequency_penalty", 0.0) <= 2.0:
        raise _validation("`frequency_penalty` must be >= -2.0 and <= 2.0")
    if "top_p" in p and not 0.0 < p["top_p"] < 1.0:
        raise _validation("`top_p` must be > 0.0 and < 1.0")
    if "typical_p" in p and not 0.0 < p["typical_p"] < 1.0:
        raise _validation("`typical_p` must be > 0.0 and < 1.0")
    if "top_k" in p and p["top_k"] <= 0:
        raise _validation("`top_k` must be strictly positive")
    if p.get("max_new_tokens") == 0:
        raise _validation("`max_new_tokens` must be strictly positive")
    if len(p["stop"]) > limits.max_stop_sequences:
        raise _validation(
            f"`stop` supports up to {limits.max_stop_sequences} stop sequences. Given: {len(p['stop'])}"
        )
    if p.get("seed") is not None and best_of > 1:
        raise _validation("`seed` must not be set when `best_of` > 1")
    top_n = p.get("top_n_tokens", 0)
    if top_n > limits.max_top_n_tokens:
        raise _validation(f"`top_n_tokens` must be >= 0 and <= {limits.max_top_n_tokens}. Given: {top_n}")
    if not inputs:
        raise _validation("`inputs` cannot be empty")
    truncate = p.get("truncate")
    if truncate is not None and (truncate == 0 or truncate > limits.max_input_tokens):
        raise _validation(
            f"`truncate` must be strictly positive and less than {limits.max_input_tokens}. Given: {truncate}"
        )
    model_inputs = read_inputs(inputs)
    length = count_tokens(model_inputs)
    if truncate is not None:
        length = min(length, truncate)
    max_new = p.get("max_new_tokens")
    if max_new is None:
        max_new = min(max(0, limits.max_total_tokens - length), _DEFAULT_GENERATION_LENGTH)
    if length + max_new > limits.max_total_tokens:
        raise _validation(
            f"`inputs` tokens + `max_new_tokens` must be <= {limits.max_total_tokens}. "
            f"Given: {length} `inputs` tokens and {max_new} `max_new_tokens`"
        )
    if length > limits.max_input_tokens:
        raise _validation(f"`inputs` must have less than {limits.max_input_tokens} tokens. Given: {length}")
    grammar = _validate_grammar(p.get("grammar"), limits)
    return ValidRequest(
        inputs=inputs,
        model_inputs=model_inputs,
        input_length=length,
        max_new_tokens=max_new,
        do_sample=sampling,
        seed=p.get("seed"),
        stop=list(p["stop"]),
        best_of=best_of,
        truncate=truncate,
        details=p["details"],
        decoder_input_details=p["decoder_input_details"],
        top_n_tokens=top_n,
        return_full_text=bool(p.get("return_full_text") or False),
        grammar=grammar,
        repetition_penalty=p.get("repetition_penalty"),
        frequency_penalty=p.get("frequency_penalty"),
        adapter_id=p.get("adapter_id"),
    )


def _validate_grammar(grammar: Any, limits: Limits) -> tuple[str, Any] | None:
    """The router's grammar checks: support, a JSON schema that parses, is valid and has properties."""
    if grammar is None:
        return None
    if not limits.grammar_support:
        raise _validation("grammar is not supported")
    kind, value = grammar["type"], grammar["value"]
    if kind == "regex":
        return ("regex", value)
    if kind == "json_schema":
        value = value["schema"]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise _validation(f"grammar is not valid: {exc}") from exc
    if not isinstance(value, dict):
        raise _validation("grammar is not supported")
    from jsonschema import Draft202012Validator

    problem = next(iter(Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(value)), None)
    if problem is not None:
        raise _validation(f"grammar is not valid: {problem.message}")
    if "properties" not in value:
        raise _validation("grammar is not valid: Grammar must have a 'properties' field")
    return ("json", value)


def _message_text(message: dict[str, Any]) -> str:
    # As TGI's router: image chunks become its markdown form ``![](url)`` in the text the model reads,
    # an assistant's tool calls their JSON.
    content = message.get("content")
    if content is None and isinstance(message.get("tool_calls"), list):
        return json.dumps(message["tool_calls"])
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(c, dict) for c in content):
        text = []
        for chunk in content:
            if chunk.get("type") == "text" and isinstance(chunk.get("text"), str):
                text.append(chunk["text"])
            elif chunk.get("type") == "image_url" and isinstance(chunk.get("image_url"), dict):
                text.append(f"![]({chunk['image_url'].get('url')})")
            else:
                break
        else:
            return "".join(text)
    raise WireError(422, "Failed to deserialize the JSON body: invalid `messages`", text=True)


def chat_to_generate(body: Any) -> dict[str, Any]:
    """A Messages API body as the ``/generate`` body the router runs (a plain-text chat template).

    Raises:
        WireError: ``messages`` is not a list of messages with string or chunk ``content`` or tool calls.
    """
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise WireError(422, "Failed to deserialize the JSON body: invalid `messages`", text=True)
    prompt = "".join(f"<|{m.get('role')}|>\n{_message_text(m)}\n" for m in messages) + "<|assistant|>\n"
    temperature = body.get("temperature")
    params: dict[str, Any] = {"do_sample": temperature != 0, "stop": body.get("stop") or []}
    if temperature not in (None, 0):
        params["temperature"] = temperature
    for ours, theirs in (
        ("max_new_tokens", "max_tokens"),
        ("top_p", "top_p"),
        ("seed", "seed"),
        ("frequency_penalty", "frequency_penalty"),
        ("grammar", "response_format"),
    ):
        if body.get(theirs) is not None:
            params[ours] = body[theirs]
    model = body.get("model")
    if isinstance(model, str) and model != "tgi":
        # TGI's router: `adapter_id: model.filter(|m| *m != "tgi")` (router/src/lib.rs, ChatRequest).
        params["adapter_id"] = model
    if body.get("presence_penalty") is not None:
        if not _CHECKS["float"][1](body["presence_penalty"]):
            raise _type_error("presence_penalty", "invalid type, expected a float")
        # What TGI's router does with it: a repetition penalty, not an OpenAI presence penalty.
        params["repetition_penalty"] = body["presence_penalty"] + 2.0
    return {"inputs": prompt, "parameters": params}
