"""``python -m asyncbackends.testing.tiny_model [PATH] [--kind KIND]``: build a tiny model, print its path.

Each kind is built once and cached (see `asyncbackends.testing.tiny_model.default_cache_dir`); with PATH it is
built there instead. Only the path goes to standard output, so ``MODEL=$(python -m ...)`` works.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["main"]


def _builders() -> dict[str, Callable[[str | os.PathLike[str] | None], Path]]:
    from ._tiny_llama import build_tiny_model
    from ._tiny_reasoning import build_tiny_reasoning_model
    from ._tiny_vlm import build_tiny_vlm

    return {"plain": build_tiny_model, "reasoning": build_tiny_reasoning_model, "vlm": build_tiny_vlm}


def main(argv: Sequence[str] | None = None) -> None:
    """Build the tiny model of the kind asked for (plain by default) and print its path."""
    parser = argparse.ArgumentParser(
        prog="python -m asyncbackends.testing.tiny_model",
        description="Build a tiny random-weight model directory (no download) and print its path.",
    )
    parser.add_argument(
        "path", nargs="?", help="where to build it (default: a folder in the cache, reused once built)"
    )
    parser.add_argument(
        "--kind",
        choices=("plain", "reasoning", "vlm"),
        default="plain",
        help="plain: a Llama; reasoning: one that thinks in <think>...</think>; vlm: images and tools "
        "(default: plain)",
    )
    args = parser.parse_args(argv)
    print(_builders()[args.kind](args.path))
