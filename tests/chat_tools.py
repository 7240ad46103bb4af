"""The ``add`` tool the chat tests send, one definition for every backend's tests."""

from __future__ import annotations

import asyncbackends as ab


def add_tool(first: str = "x", second: str = "y") -> ab.Tool:
    """The ``add`` tool: two required integer arguments named ``first`` and ``second``."""
    return ab.Tool(
        "add",
        "Add two integers.",
        {
            "type": "object",
            "properties": {first: {"type": "integer"}, second: {"type": "integer"}},
            "required": [first, second],
        },
    )
