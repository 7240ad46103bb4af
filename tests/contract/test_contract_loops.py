"""The contract suite on both event loops: asyncio's own and uvloop.

The session runs on one loop (uvloop when installed, unless ``ASYNCBACKENDS_UVLOOP=0``); the project's cheap
contract modules run again in a pytest subprocess on the other one. A stock asyncio loop holds its own
sockets and every transport on it, which the resource check once reported as the adapter's leaks.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing.contract._inspect import foreign_loop_state, open_resources

ROOT = Path(__file__).resolve().parents[2]
# The contract modules whose backends need no engine (the vLLM, `vllm serve` and Ray ones run once, on the
# session's loop: an engine start costs more than the loop check is worth there).
MODULES = [
    "tests/contract/test_contract_mock.py",
    "tests/tgi/test_contract_tgi.py",
    "tests/endpoints/test_contract_endpoints.py",
    "tests/pool/test_contract_pool.py",
]
# Runs pytest, then names the loop the session's tests ran on (the manager is still the one they used).
_RUN = (
    "import sys, pytest, asyncbackends as ab\n"
    "code = pytest.main(sys.argv[1:])\n"
    "manager = ab.get_loop_manager()\n"
    "print('LOOP-RAN:', type(manager.loop).__module__ if manager.running else 'none')\n"
    "sys.exit(code)\n"
)


class _Holder:
    """A backend-shaped object: a loop it uses, and possibly a socket of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop, own: Any = None) -> None:
        self._loop = loop
        self._own = own


def test_a_loops_own_sockets_are_not_the_backends() -> None:
    """A backend holding an asyncio loop is not charged with the loop's self-pipe or others' transports."""
    loop = asyncio.new_event_loop()  # asyncio's own: it holds a socketpair (its self-pipe) from the start
    try:
        assert any(isinstance(v, socket.socket) for v in vars(loop).values())
        assert open_resources(_Holder(loop)) == []
        own = socket.socket()
        try:
            assert open_resources(_Holder(loop, own)) == ["backend._own (a socket.socket) is still open"]
        finally:
            own.close()
        # The loop itself is still named by the foreign-loop check.
        shared = asyncio.new_event_loop()
        try:
            assert foreign_loop_state(_Holder(loop), shared) == [
                "backend._loop is an event loop other than the shared one (idle)"
            ]
        finally:
            shared.close()
    finally:
        loop.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_contract_suite_on_the_other_loop() -> None:
    """The cheap contract modules pass on the loop this session is not running on."""
    if importlib.util.find_spec("uvloop") is None:
        pytest.skip("uvloop is not installed: this session's contract tests ran on asyncio's loop")
    here = type(ab.get_loop_manager().loop).__module__
    other, flag = ("asyncio", "0") if here.startswith("uvloop") else ("uvloop", "1")
    env = {**os.environ, "ASYNCBACKENDS_UVLOOP": flag}
    run = subprocess.run(
        [sys.executable, "-c", _RUN, "-q", "-p", "no:cacheprovider", *MODULES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, f"the contract tests failed on {other}'s loop:\n{tail}"
    assert f"LOOP-RAN: {other}" in run.stdout, tail
