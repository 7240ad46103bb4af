"""Field checks shared by the frozen request, result and sampling dataclasses (`asyncbackends._types`)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

from .errors import InvalidRequestError

__all__ = ["as_floats", "as_ints", "check_adapter", "check_request_id", "is_int", "is_number", "set_field"]


def is_int(value: object) -> bool:
    """Whether ``value`` is an int and not a bool."""
    # bool is an int subclass; True as a token id or max_tokens is always a mistake.
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is a finite int or float and not a bool."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def set_field(obj: object, name: str, value: object) -> None:
    """Set a field of a frozen dataclass while it is being built."""
    # Normalising fields of a frozen dataclass in __post_init__ needs the object.__setattr__ escape hatch.
    object.__setattr__(obj, name, value)


def as_ints(name: str, values: object) -> tuple[int, ...]:
    """``values`` as a tuple of ints, or `InvalidRequestError` naming the field ``name``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidRequestError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    try:
        # operator.index takes numpy and other integer types, refuses floats and bools are ints anyway.
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise InvalidRequestError(f"{name} must hold only ints") from None


def as_floats(name: str, values: object) -> tuple[float, ...]:
    """``values`` as a tuple of floats, or `InvalidRequestError` naming the field ``name``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidRequestError(
            f"{name} must be a sequence of numbers or None, got {type(values).__name__}"
        )
    try:
        return tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"{name} must hold only numbers") from None


def check_request_id(request_id: object) -> None:
    """Refuse a request id that is neither a str nor ``None``."""
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequestError(f"request_id must be a str or None, got {type(request_id).__name__}")


def check_adapter(adapter: object) -> None:
    """Refuse an adapter name that is not ``None`` or a non-empty str without surrounding whitespace."""
    if adapter is None:
        return
    if not isinstance(adapter, str):
        raise InvalidRequestError(f"adapter must be a str or None, got {type(adapter).__name__}")
    # The name travels as a server's model name, a TGI adapter_id and a cache key: a stray blank would make
    # a name that looks like a known one and is not.
    if not adapter or adapter != adapter.strip() or not adapter.isprintable():
        raise InvalidRequestError(
            "adapter must be a non-empty name without surrounding blanks or control characters, "
            f"got {adapter!r}"
        )
