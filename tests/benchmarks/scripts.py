"""Importing the benchmark scripts (not a package) for their tests."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).parents[2] / "benchmarks" / "gpu"


@contextlib.contextmanager
def benchmark_module(name: str, *also_loaded: str) -> Iterator[ModuleType]:
    """``benchmarks/gpu/<name>.py`` imported; afterwards ``sys.path`` is restored and it (and ``also_loaded``,
    the scripts it imports) forgotten, so no other test sees them."""
    saved_path = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path[:] = saved_path
        for loaded in (name, *also_loaded):
            sys.modules.pop(loaded, None)


def load_script(path: Path, name: str) -> ModuleType:
    """The benchmark script at ``path`` imported as module ``name``, left out of ``sys.modules``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
