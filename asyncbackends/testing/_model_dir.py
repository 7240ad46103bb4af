"""Writing a model directory so that no reader ever sees half of it (the tiny models' and LoRA's builders)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["build_atomically"]


def build_atomically(target: Path, write: Callable[[Path], None], *, marker: str = "config.json") -> Path:
    """Run ``write`` on a fresh folder beside ``target``, then rename that folder to ``target``.

    Concurrent builders (pytest-xdist, two terminals) never see a half-written directory, and the loser of
    the race simply discards its copy (the winner's ``marker`` file, ``config.json`` for a model, is then
    there).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cached model is meant to be shared
    try:
        write(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / marker).is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
