"""Start a real ``vllm serve`` (``python -m vllm.entrypoints.openai.api_server``) on a tiny model, and ask it.

The starter the differential suite (tests/parity) and tests/reasoning share: the server runs in a process group
of its own (`processes.start_group`) on a free loopback port, with the suite's engine settings
(`tiny_engine.ENGINE_OPTIONS`) as command-line flags; the caller waits for it with `wait_until_serving`, so
its start-up can overlap an in-process engine's. Importing this module imports no engine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .processes import start_group, stop_group, wait_until_serving
from .tiny_engine import ENGINE_OPTIONS, build_backend

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 480.0
"""How long a server may take to start (a minute alone; several minutes beside busy neighbours)."""
COMPACT_JSON = '--structured-outputs-config={"backend": "xgrammar", "disable_any_whitespace": true}'
"""The structured-output setting `tiny_engine.build_backend` gives in-process engines (no free whitespace)."""


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_vllm_serve(model: str, log: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``vllm serve`` on ``model`` with `ENGINE_OPTIONS` and ``flags``, its output in ``log``.

    Returns:
        The server's process (stop it with `processes.stop_group`) and its root URL.
    """
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT)}
    options = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in ENGINE_OPTIONS.items()]
    with open(log, "wb") as out:
        server = start_group(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
             "--port", str(port), *options, *flags],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )  # fmt: skip
    return server, f"http://127.0.0.1:{port}"


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` as JSON to ``url`` and return the JSON answer (an HTTP error raises, its body noted)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        exc.add_note(exc.read().decode(errors="replace"))
        raise
    return answer


@dataclass(frozen=True)
class Pair:
    """A served model and an in-process ``vllm`` backend on the same weights and options."""

    url: str  # the server root
    model: str
    backend: Any  # the in-process VLLMBackend
    parser: str | None = None  # the reasoning parser both were given, if any

    def chat(self, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """One ``/v1/chat/completions`` call on the server, greedy, with the prompt's and output's token ids."""
        body = {"messages": messages, "temperature": 0, "return_token_ids": True, **fields}
        return post(self.url + "/v1/chat/completions", {"model": self.model, **body})

    def complete(self, prompt: str, **fields: Any) -> dict[str, Any]:
        """One ``/v1/completions`` call on the server, greedy, with the prompt's and output's token ids."""
        body = {"prompt": prompt, "temperature": 0, "return_token_ids": True, **fields}
        return post(self.url + "/v1/completions", {"model": self.model, **body})


def serve_pair(model: str, work: Path, flags: tuple[str, ...] = (), **options: Any) -> Iterator[Pair]:
    """A `Pair` on ``model`` (the body of a pair fixture): the server started with ``flags``, the backend with
    ``options`` (`tiny_engine.build_backend`; ``reasoning_parser`` is the pair's ``parser``), the server first
    so the two start-ups overlap; both stopped after. The server's log is ``work/server.log``."""
    log = work / "server.log"
    server, url = start_vllm_serve(model, log, *flags)
    backend = None
    try:
        backend = build_backend(model, **options)
        wait_until_serving(server, url, log, START_TIMEOUT)
        yield Pair(url, model, backend, options.get("reasoning_parser"))
    finally:
        if backend is not None:
            backend.close()
        stop_group(server)


_SHARED: dict[str, Iterator[Pair]] = {}
_PAIRS: dict[str, Pair] = {}


def shared_pair(key: str, config: pytest.Config, start: Callable[[], Iterator[Pair]]) -> Pair:
    """The pair ``start`` (a `serve_pair` iterator) starts, started once for the session under ``key``.

    For a pair several test packages use (a start costs a minute here): it runs until `release_pair` (by its
    last known user) or the session's end, whichever is first; a later request starts it again.
    """
    if key not in _PAIRS:
        pairs = start()
        _PAIRS[key] = next(pairs)
        _SHARED[key] = pairs
        config.add_cleanup(lambda: release_pair(key))
    return _PAIRS[key]


def release_pair(key: str) -> None:
    """Stop the shared pair under ``key`` (backend closed, server stopped), if it runs."""
    _PAIRS.pop(key, None)
    pairs = _SHARED.pop(key, None)
    if pairs is not None:
        pairs.close()  # GeneratorExit at serve_pair's yield: its finally stops both
