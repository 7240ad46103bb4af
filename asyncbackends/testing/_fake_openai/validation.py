"""The look-alike's validation of a batch input file, as OpenAI's ``validating`` step fails a batch."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["validate_lines"]


def validate_lines(
    content: bytes, endpoint: str, max_requests: int
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The file's request lines, or the first problem (a ``BatchError``: code, message, param, line)."""
    lines: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), 1):
        try:
            line = json.loads(raw)
            custom_id, url = line["custom_id"], line["url"]
            valid = line["method"] == "POST" and isinstance(line["body"], dict)
        except (ValueError, KeyError, TypeError):
            custom_id, url, valid = None, None, False
        problem = (
            "not a valid request line" if not valid or not isinstance(custom_id, str)
            else f"duplicate custom_id {custom_id!r}" if custom_id in seen
            else f"url {url!r} does not match the batch's endpoint" if url != endpoint
            else None
        )  # fmt: skip
        if problem is not None:
            return [], {"code": "invalid_request", "message": problem, "param": None, "line": number}
        seen.add(custom_id)
        lines.append(line)
    if len(lines) > max_requests:
        message = f"{len(lines)} requests, over the limit of {max_requests}"
        return [], {"code": "too_many_requests", "message": message, "param": None, "line": None}
    return lines, None
