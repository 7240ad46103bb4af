"""The settings and the builder of the suite's vLLM engines on the tiny models (see /work/shared/ENGINE.md).

Kept apart from any conftest so the session's one text engine (``tiny_vllm_engine`` in tests/conftest.py)
serves tests/vllm and tests/integrations alike: an engine start costs 20-60 s on a small CPU machine.
Importing this module imports no engine.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import asyncbackends as ab

# On a CPU the KV cache is carved out of RAM; the default would reserve far more than tests need.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

ENGINE_OPTIONS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 512,
}
"""Settings that run on a 2-core CPU machine; tests rely on max_model_len=512."""


def build_backend(model: str, **options: Any) -> Any:
    """A `vllm` backend on ``model`` with `ENGINE_OPTIONS` (``options`` on top); the caller closes it."""
    # vLLM imports modules lazily during start-up and some emit Deprecation/FutureWarnings, which the
    # suite's filterwarnings=error would turn into start-up failures; they are not ours to fix.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        from vllm.config import StructuredOutputsConfig

        # JSON without free whitespace: the random-weight model would otherwise pad an object with blanks
        # until max_tokens (test_sampling_vllm.py). It changes nothing else.
        compact = StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)
        return ab.create_backend(
            "vllm", model=model, **{**ENGINE_OPTIONS, "structured_outputs_config": compact, **options}
        )
