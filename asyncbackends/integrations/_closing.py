"""Closing a backend that an integration built, once the framework drops the object holding it.

lm-eval builds its ``LM`` from a model name and never closes it: it drops it once the evaluation ends. The
backend would then go with it, and the garbage collector would tear its engine down out of order: vLLM's own
finaliser kills the engine core ("force killing remaining process EngineCore"), its output handler fails with
``EngineDeadError``, and a shared-memory segment leaks, all printed before lm-eval's results table.
`close_when_dropped` closes the backend in order instead, on the shared loop, as ``aclose`` would.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from .._loop import get_loop_manager
from .._protocol import AsyncBackend
from ..errors import LoopError

__all__ = ["close_when_dropped"]


def close_when_dropped(owner: Any, backend: AsyncBackend) -> None:
    """Close ``backend`` once ``owner`` is garbage (``backend`` lives until then).

    The close runs on the shared loop, not in the collecting thread (any thread, the loop's own included):
    the process goes on meanwhile, and the loop manager's exit hook waits for the close to end. At exit the
    manager closes the backends still open itself, so this finaliser is not run then.
    """
    weakref.finalize(owner, _close_on_the_loop, backend).atexit = False


def _close_on_the_loop(backend: AsyncBackend) -> None:
    with contextlib.suppress(LoopError):  # the manager is gone (the process is exiting): nothing to do
        get_loop_manager().submit(backend.aclose())
