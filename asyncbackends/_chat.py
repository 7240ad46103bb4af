"""Chat as frameworks speak it: content parts, images, tools and tool calls (OpenAI's chat shape).

```python
{"role": "user", "content": [{"type": "text", "text": "What is in the picture?"},
                             ab.image_part("cat.png")]}
{"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                      "function": {"name": "add", "arguments": '{"x": 1}'}}]}
{"role": "tool", "tool_call_id": "call_1", "content": "3"}
```

Messages are validated when a `GenerationRequest` is built; each failure raises `InvalidRequestError`
naming the field (``prompt[0].content[1].image_url.url``). A prompt never reads a local file: local images
enter through `image_part`, which turns them into base64 data URLs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, TypeAlias

from ._field_checks import set_field
from .errors import InvalidRequestError

__all__ = [
    "CHAT_ROLES",
    "TOOL_CHOICES",
    "ChatMessage",
    "Tool",
    "ToolCall",
    "image_digest",
    "image_part",
    "image_urls",
    "normalise_message",
    "uses_tools",
]

ChatMessage: TypeAlias = Mapping[str, Any]
"""One chat message in OpenAI's shape: ``{"role": "user", "content": "..." | [parts]}``."""

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
"""The chat roles a `GenerationRequest` accepts."""

TOOL_CHOICES = frozenset({"auto", "none", "required"})
"""The tool choices besides the name of one of the request's tools."""

# OpenAI's rule for function names; servers (vLLM, TGI) and chat templates rely on it.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)((?:;[\w.+-]+=[\w.+-]+)*);base64,(.*)$", re.S)
_MESSAGE_KEYS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls"},
    "tool": {"role", "content", "tool_call_id"},
}
# Magic numbers of the image formats every vision server decodes, for the data URL's media type.
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"))


def _check_json(name: str, value: object) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{name} must be JSON-serialisable: {exc}") from None


@dataclass(frozen=True, slots=True, eq=True)
class Tool:
    """A function the model may call.

    Args:
        name: The function's name (letters, digits, ``_`` and ``-``; at most 64), unique in a request.
        description: What it does, for the model.
        parameters: Its arguments as a JSON Schema object (``{"type": "object", "properties": {...}}``).
        strict: OpenAI's ``strict`` flag, sent as given; ``None`` (the default) leaves it out.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOOL_NAME.match(self.name):
            raise InvalidRequestError(
                f"Tool.name must be 1-64 letters, digits, '_' or '-', got {self.name!r}"
            )
        if not isinstance(self.description, str):
            raise InvalidRequestError(
                f"Tool.description must be a str, got {type(self.description).__name__}"
            )
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type") != "object":
            raise InvalidRequestError(
                f"Tool.parameters of {self.name!r} must be a JSON Schema object "
                '({"type": "object", "properties": {...}})'
            )
        properties = self.parameters.get("properties", {})
        if not isinstance(properties, Mapping) or not all(
            isinstance(v, Mapping) for v in properties.values()
        ):
            raise InvalidRequestError(
                f"Tool.parameters.properties of {self.name!r} must map names to schemas"
            )
        if self.strict is not None and not isinstance(self.strict, bool):
            raise InvalidRequestError(f"Tool.strict of {self.name!r} must be a bool or None")
        required = self.parameters.get("required", [])
        if not isinstance(required, Sequence) or isinstance(required, str):
            raise InvalidRequestError(f"Tool.parameters.required of {self.name!r} must be a list of names")
        _check_json(f"Tool.parameters of {self.name!r}", self.parameters)
        # A deep copy through JSON: the tool holds its own schema, in the types JSON has.
        set_field(self, "parameters", json.loads(json.dumps(self.parameters)))

    def __hash__(self) -> int:
        return hash((self.name, self.description, json.dumps(self.parameters, sort_keys=True), self.strict))

    def to_openai(self) -> dict[str, Any]:
        """This tool as OpenAI's ``tools`` entry: ``{"type": "function", "function": {...}}``.

        The function's keys in the order of OpenAI's and vLLM's models (name, description, parameters,
        strict): a chat template that writes a tool given as this dict with ``tojson`` then writes what
        ``vllm serve`` writes for a described tool.
        """
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}

    @classmethod
    def from_openai(cls, data: Mapping[str, Any]) -> Tool:
        """Read a tool in OpenAI's shape (``{"type": "function", "function": {...}}``).

        Raises:
            InvalidRequestError: It is not in that shape, or its fields are invalid.
        """
        if not isinstance(data, Mapping) or data.get("type") != "function":
            raise InvalidRequestError('a tool must be {"type": "function", "function": {...}}')
        function = data.get("function")
        if not isinstance(function, Mapping) or set(function) - {
            "name",
            "description",
            "parameters",
            "strict",
        }:
            raise InvalidRequestError("a tool's function must hold name, description and parameters only")
        return cls(
            function.get("name"),  # type: ignore[arg-type]  # checked by Tool
            function.get("description") or "",
            function.get("parameters", {"type": "object", "properties": {}}),
            function.get("strict"),
        )


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model asked for.

    Args:
        id: The call's id, which the ``role: "tool"`` message answering it names in ``tool_call_id``.
        name: The tool's name.
        arguments: The JSON text the model produced for the arguments (not checked: a model may err).
    """

    id: str
    name: str
    arguments: str = "{}"

    def __post_init__(self) -> None:
        for name in ("id", "name", "arguments"):
            if not isinstance(getattr(self, name), str):
                raise InvalidRequestError(f"ToolCall.{name} must be a str, got {getattr(self, name)!r}")
        if not self.id or not self.name:
            raise InvalidRequestError("ToolCall.id and ToolCall.name must not be empty")

    def to_openai(self) -> dict[str, Any]:
        """This call in OpenAI's shape, as an assistant message's ``tool_calls`` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_openai(cls, data: Mapping[str, Any], *, where: str = "tool call") -> ToolCall:
        """Read a call in OpenAI's shape, or `InvalidRequestError` naming ``where``."""
        if isinstance(data, ToolCall):
            return data
        function = data.get("function") if isinstance(data, Mapping) else None
        if not isinstance(function, Mapping) or data.get("type", "function") != "function":
            raise InvalidRequestError(f'{where} must be {{"id", "type": "function", "function": {{...}}}}')
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, Mapping):
            arguments = json.dumps(arguments)
        try:
            return cls(data.get("id"), function.get("name"), arguments)  # type: ignore[arg-type]
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"{where}: {exc}") from None


def image_part(image: object) -> dict[str, Any]:
    """An ``image_url`` content part for ``image``.

    Args:
        image: A PIL image (sent as PNG), the bytes of a PNG/JPEG/GIF/WebP file, a local path (str or
            `os.PathLike`), an http(s) URL (sent as it is) or a ``data:`` URL.

    Returns:
        ``{"type": "image_url", "image_url": {"url": ...}}``; local data becomes a base64 data URL.

    Raises:
        InvalidRequestError: The image is none of the above, or its bytes are no known image format.
    """
    if isinstance(image, str) and image.startswith(("http://", "https://", "data:")):
        url = image
    elif isinstance(image, (bytes, bytearray, memoryview)):
        url = _data_url(bytes(image), "image")
    elif isinstance(image, (str, PathLike)):
        path = Path(image)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InvalidRequestError(f"image_part cannot read {str(path)!r}: {exc.strerror}") from None
        url = _data_url(data, f"image {str(path)!r}")
    elif hasattr(image, "save") and hasattr(image, "size"):  # a PIL image, without importing PIL
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    else:
        raise InvalidRequestError(
            f"image_part takes a PIL image, bytes, a local path or an http(s) URL, got {type(image).__name__}"
        )
    return _normalise_part("image_part", {"type": "image_url", "image_url": {"url": url}}, images=True)


def _data_url(data: bytes, what: str) -> str:
    mime = next((m for magic, m in _MAGIC if data.startswith(magic)), None)
    if mime is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        mime = "image/webp"
    if mime is None:
        raise InvalidRequestError(f"{what} is not a PNG, JPEG, GIF or WebP image")
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def image_digest(url: str, length: int = 16) -> str:
    """The SHA-256 hex digest of an image URL, cut to ``length``: of the decoded bytes for a data URL."""
    match = _DATA_URL.match(url)
    payload = base64.b64decode(match.group(3)) if match else url.encode()
    return hashlib.sha256(payload).hexdigest()[:length]


def _check_url(where: str, url: object) -> None:
    if not isinstance(url, str) or not url:
        raise InvalidRequestError(f"{where} must be a non-empty str")
    if url.startswith("data:"):
        match = _DATA_URL.match(url)
        if match is None:
            raise InvalidRequestError(f"{where} must be a base64 data URL (data:<type>;base64,<data>)")
        try:
            base64.b64decode(match.group(3), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequestError(f"{where} is a data URL whose data is not base64") from None
        if not match.group(1).startswith("image/"):
            raise InvalidRequestError(f"{where} must be an image, got {match.group(1)!r}")
    elif not url.startswith(("http://", "https://")):
        # Never a local path or file:// URL: a prompt must not read files implicitly.
        raise InvalidRequestError(
            f"{where} must be an http(s) or base64 data URL; turn local images into parts with ab.image_part"
        )


def _normalise_part(where: str, part: object, *, images: bool) -> dict[str, Any]:
    if not isinstance(part, Mapping):
        raise InvalidRequestError(f"{where} must be a content part (a dict), got {type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
        if set(part) != {"type", "text"} or not isinstance(part["text"], str):
            raise InvalidRequestError(f'{where} must be {{"type": "text", "text": str}}')
        return {"type": "text", "text": part["text"]}
    if kind == "image_url":
        if not images:
            raise InvalidRequestError(f"{where}: image parts belong in user messages only")
        image = part.get("image_url")
        if isinstance(image, str):  # a shorthand some clients send; normalised to OpenAI's object
            image = {"url": image}
        if (
            set(part) != {"type", "image_url"}
            or not isinstance(image, Mapping)
            or set(image) - {"url", "detail"}
        ):
            raise InvalidRequestError(f'{where} must be {{"type": "image_url", "image_url": {{"url": str}}}}')
        _check_url(f"{where}.image_url.url", image.get("url"))
        detail = image.get("detail")
        if detail is not None and detail not in ("auto", "low", "high"):
            raise InvalidRequestError(f"{where}.image_url.detail must be 'auto', 'low' or 'high'")
        return {"type": "image_url", "image_url": dict(image)}
    raise InvalidRequestError(f"{where}.type must be 'text' or 'image_url', got {kind!r}")


def normalise_message(index: int, message: Mapping[str, Any]) -> dict[str, Any]:
    """Validate one chat message and return the request's own copy of it.

    Raises:
        InvalidRequestError: Naming the field (``prompt[index]....``) that is wrong.
    """
    where = f"prompt[{index}]"
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise InvalidRequestError(f"{where}.role must be one of {sorted(CHAT_ROLES)}, got {role!r}")
    extra = set(message) - _MESSAGE_KEYS[role]
    if extra:
        raise InvalidRequestError(f"{where} has unknown keys {sorted(extra)} for role {role!r}")
    out: dict[str, Any] = {"role": role}
    if "name" in message:
        if not isinstance(message["name"], str):
            raise InvalidRequestError(f"{where}.name must be a str")
        out["name"] = message["name"]
    calls = message.get("tool_calls")
    content = message.get("content")
    if isinstance(content, str):
        out["content"] = content
    elif content is None and calls:
        out["content"] = ""  # OpenAI allows null content beside tool calls; one value for "none"
    elif isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)) and content:
        out["content"] = [
            _normalise_part(f"{where}.content[{i}]", part, images=role == "user")
            for i, part in enumerate(content)
        ]
    else:
        raise InvalidRequestError(
            f"{where}.content must be a str or a non-empty list of content parts, "
            f"got {type(content).__name__}"
        )
    if calls is not None:
        if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
            raise InvalidRequestError(f"{where}.tool_calls must be a list of tool calls")
        out["tool_calls"] = [
            ToolCall.from_openai(call, where=f"{where}.tool_calls[{i}]").to_openai()
            for i, call in enumerate(calls)
        ]
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequestError(f"{where}.tool_call_id must name the call this tool message answers")
        out["tool_call_id"] = call_id
    return out


def image_urls(messages: Sequence[ChatMessage]) -> Iterator[str]:
    """The URLs of every image part in ``messages``, in order."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            yield from (p["image_url"]["url"] for p in content if p.get("type") == "image_url")


def uses_tools(messages: Sequence[ChatMessage]) -> bool:
    """Whether ``messages`` hold tool calls or tool results (only a backend with tools can render them)."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)
