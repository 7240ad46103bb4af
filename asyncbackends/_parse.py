"""``key=value`` option parsing, one parser for the command line and the pytest plugin.

The CLI's ``--option`` and the plugin's ``--backend-option`` both read values here, so the plugin does not
import the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .errors import InvalidRequestError

__all__ = ["parse_option_value", "parse_options"]

_OPTION_WORDS: dict[str, Any] = {"true": True, "false": False, "none": None, "null": None}


def parse_option_value(text: str) -> Any:
    """Read one option value: JSON where it parses, else true/false/none in any case, else the text.

    Examples: ``"8"`` -> ``8``, ``"0.5"`` -> ``0.5``, ``"True"`` -> ``True``, ``"[1, 2]"`` -> ``[1, 2]``,
    ``'"8"'`` -> ``"8"`` (quote a number to keep it text), ``"float32"`` -> ``"float32"``.
    """
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except ValueError:
        return _OPTION_WORDS.get(stripped.lower(), text)


def parse_options(pairs: Sequence[str], *, flag: str = "--option") -> dict[str, Any]:
    """``["key=value", ...]`` to a dict, values read by `parse_option_value`.

    Args:
        pairs: The ``key=value`` items, in order (a later key wins).
        flag: The command-line flag they came from, for the error message.

    Raises:
        InvalidRequestError: An item has no ``=`` or an empty key.
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidRequestError(f"{flag} must look like key=value, got {pair!r}")
        options[key.strip()] = parse_option_value(value)
    return options
