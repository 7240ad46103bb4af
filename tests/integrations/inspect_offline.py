"""vLLM's offline ``LLM.chat`` as a reference for the inspect tests: `_inspect_chat_reference.py` in a process
group of its own, started at once so its engine start overlaps the tested one's."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..processes import start_group, stop_group

SCRIPT = Path(__file__).with_name("_inspect_chat_reference.py")


@contextlib.contextmanager
def offline_chat_reference(
    model: str,
    options: dict[str, Any],
    conversations: list[list[dict[str, str]]],
    max_tokens: int,
    work: Path,
    lora: str | None = None,
) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Start the reference; the value, once called, waits for its rows (``text``, token counts); stopped at exit.

    ``lora``: an adapter directory every conversation is sent with (``options`` then enable LoRA).
    """
    (work / "in.json").write_text(json.dumps(conversations))
    args = [model, json.dumps(options), str(work / "in.json"), str(max_tokens), str(work / "out.json")]
    log = (work / "log.txt").open("wb")
    command = [sys.executable, str(SCRIPT), *args, *([lora] if lora else [])]
    proc = start_group(command, stdout=log, stderr=subprocess.STDOUT)

    def rows() -> list[dict[str, Any]]:
        assert proc.wait(timeout=400) == 0, (work / "log.txt").read_text()[-3000:]
        return json.loads((work / "out.json").read_text())  # type: ignore[no-any-return]

    try:
        yield rows
    finally:
        stop_group(proc)
        log.close()
