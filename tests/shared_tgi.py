"""A TGI look-alike served on the shared loop for a whole module, and its chat route asked by hand.

Sync tests (inspect's eval, `run_batch`) reach it from their own thread; the hand-made request is the
reference an adapter's result is compared with.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import asyncbackends as ab
from asyncbackends.testing.fake_tgi import FakeTGIServer


def served_tgi(**options: Any) -> Iterator[FakeTGIServer]:
    """Yield a started look-alike on the shared loop, stopped afterwards (a fixture's body)."""
    manager = ab.get_loop_manager()
    server = manager.run(FakeTGIServer(**{"check_schema": False, **options}).start())
    try:
        yield server
    finally:
        manager.run(server.stop())


def chat_answer(server: FakeTGIServer, body: dict[str, Any]) -> dict[str, Any]:
    """The look-alike's own answer to ``POST /v1/chat/completions`` with ``body``."""
    request = urllib.request.Request(
        server.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        reply: dict[str, Any] = json.load(answer)
    return reply
