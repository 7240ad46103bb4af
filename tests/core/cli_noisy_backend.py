"""An adapter that writes to stdout while it starts, as vLLM's engine and its child processes do."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from asyncbackends.adapters.mock import MockBackend


class NoisyBackend(MockBackend):
    def __init__(self, **options: Any) -> None:
        print("INFO a log line printed with print()")
        sys.stdout.flush()
        os.write(1, b"INFO a log line written to file descriptor 1\n")
        subprocess.run([sys.executable, "-c", "print('INFO a child process inherits stdout')"], check=True)
        super().__init__(**options)
