"""Reading adapter option values given as text (``--option key=value`` on a command line)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["parse_option_value"]

_WORDS: dict[str, Any] = {"true": True, "false": False, "none": None, "null": None}


def parse_option_value(text: str) -> Any:
    """Read one option value: JSON where it parses, else true/false/none in any case, else the text.

    Examples: ``"8"`` -> ``8``, ``"0.5"`` -> ``0.5``, ``"true"`` and ``"True"`` -> ``True``, ``"[1, 2]"`` ->
    ``[1, 2]``, ``'{"a": 1}'`` -> ``{"a": 1}``, ``'"8"'`` -> ``"8"`` (quote a number to keep it text),
    ``"float32"`` -> ``"float32"``.
    """
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    return _WORDS.get(stripped.lower(), text)
