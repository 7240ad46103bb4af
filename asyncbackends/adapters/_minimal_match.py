"""The shortest, first-choice text matching a regex or a JSON Schema: how the echo models obey a constraint.

The `mock` adapter and the fake TGI server have no logits to constrain, so under ``regex`` or
``json_schema`` they answer with one fixed text that satisfies it: each repetition at its minimum count,
the first alternative of each choice, the first character a class allows; for a schema, the required
properties only, each at its smallest valid value. Deterministic, so tests can predict it, and checked
against the constraint (`re.fullmatch`) before it is returned.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping

# re._parser is the parser behind `re` itself (sre_parse, without its deprecation warning, since 3.11).
from re import _constants as _c  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]
from typing import Any

__all__ = ["NoMatchError", "minimal_json", "minimal_regex_match"]

_PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " "
_CATEGORY_CHAR = {
    _c.CATEGORY_DIGIT: "0",
    _c.CATEGORY_NOT_DIGIT: "a",
    _c.CATEGORY_SPACE: " ",
    _c.CATEGORY_NOT_SPACE: "a",
    _c.CATEGORY_WORD: "a",
    _c.CATEGORY_NOT_WORD: " ",
}
_CATEGORY_RE = {
    _c.CATEGORY_DIGIT: (r"\d", False),
    _c.CATEGORY_NOT_DIGIT: (r"\d", True),
    _c.CATEGORY_SPACE: (r"\s", False),
    _c.CATEGORY_NOT_SPACE: (r"\s", True),
    _c.CATEGORY_WORD: (r"\w", False),
    _c.CATEGORY_NOT_WORD: (r"\w", True),
}


class NoMatchError(ValueError):
    """No text could be built for the constraint (a construct this generator does not cover)."""


def minimal_regex_match(pattern: str) -> str:
    """The shortest first-choice text that ``re.fullmatch`` accepts for ``pattern``.

    Raises:
        NoMatchError: The pattern uses a construct (lookarounds that exclude the text built) that defeats it.
    """
    groups: dict[int, str] = {}
    text = _emit(_parser.parse(pattern), groups)
    if re.fullmatch(pattern, text) is None:
        raise NoMatchError(f"cannot build a text matching {pattern!r}")
    return text


def _emit(parsed: Any, groups: dict[int, str]) -> str:
    out = []
    for op, arg in parsed:
        if op is _c.LITERAL:
            out.append(chr(arg))
        elif op is _c.NOT_LITERAL:
            out.append("a" if chr(arg) != "a" else "b")
        elif op is _c.ANY:
            out.append("a")
        elif op is _c.IN:
            out.append(_class_char(arg))
        elif op is _c.BRANCH:
            out.append(_emit(arg[1][0], groups))
        elif op is _c.SUBPATTERN:
            group, _, _, sub = arg
            text = _emit(sub, groups)
            if group is not None:
                groups[group] = text
            out.append(text)
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)):
            low, _, sub = arg
            out.append(_emit(sub, groups) * low)
        elif op is getattr(_c, "ATOMIC_GROUP", None):
            out.append(_emit(arg, groups))
        elif op is _c.GROUPREF:
            out.append(groups.get(arg, ""))
        elif op in (_c.AT, _c.ASSERT, _c.ASSERT_NOT):
            continue  # anchors and lookarounds consume nothing; fullmatch checks the result
        else:
            raise NoMatchError(f"unsupported regex construct {op}")
    return "".join(out)


def _class_char(items: list[tuple[Any, Any]]) -> str:
    negate = bool(items) and items[0][0] is _c.NEGATE
    members = items[1:] if negate else items
    if not negate:
        for op, arg in members:
            if op is _c.LITERAL:
                return chr(arg)
            if op is _c.RANGE:
                return chr(arg[0])
            if op is _c.CATEGORY and arg in _CATEGORY_CHAR:
                return _CATEGORY_CHAR[arg]
    for char in _PRINTABLE:
        if _in_class(char, members) != negate:
            return char
    raise NoMatchError("a character class no printable character satisfies")


def _in_class(char: str, members: list[tuple[Any, Any]]) -> bool:
    code = ord(char)
    for op, arg in members:
        if op is _c.LITERAL and code == arg:
            return True
        if op is _c.RANGE and arg[0] <= code <= arg[1]:
            return True
        if op is _c.CATEGORY and arg in _CATEGORY_RE:
            pattern, negated = _CATEGORY_RE[arg]
            if (re.fullmatch(pattern, char) is not None) != negated:
                return True
    return False


def minimal_json(schema: Mapping[str, Any]) -> str:
    """Compact JSON text of the smallest instance of ``schema`` (required properties only).

    Raises:
        NoMatchError: The schema uses a construct this generator does not cover.
    """
    return json.dumps(_instance(schema, schema), separators=(",", ":"))


def _instance(schema: Any, root: Mapping[str, Any]) -> Any:
    if not isinstance(schema, Mapping):
        return None  # `true` (anything) as a subschema
    if "$ref" in schema:
        return _instance(_resolve(schema["$ref"], root), root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _instance(schema[key][0], root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0] if kind else None
    if kind is None:
        kind = "object" if "properties" in schema else None
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: _instance(properties.get(name, {}), root) for name in schema.get("required", ())}
    if kind == "array":
        return [_instance(schema.get("items", {}), root) for _ in range(int(schema.get("minItems", 0)))]
    if kind == "string":
        if "pattern" in schema:
            return minimal_regex_match(str(schema["pattern"]))
        return "a" * int(schema.get("minLength", 0))
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        value = 0 if low is None else int(low) + (1 if "exclusiveMinimum" in schema else 0)
        return value if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    if kind in ("null", None):
        return None
    raise NoMatchError(f"unsupported JSON Schema type {kind!r}")


def _resolve(ref: str, root: Mapping[str, Any]) -> Any:
    if not ref.startswith("#"):
        raise NoMatchError(f"only local $ref are supported, got {ref!r}")
    node: Any = root
    for part in filter(None, ref[1:].split("/")):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node
