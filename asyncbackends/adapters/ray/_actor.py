"""`ReplicaActor`: the long-lived Ray actor behind each replica of the ``ray`` backend.

The class is plain Python; `asyncbackends.adapters.ray` turns it into a Ray actor with ``ray.remote`` when
the backend starts, so importing this module imports no Ray. Inside the actor's process the hosted backend
is built through our registry (``acreate_backend``: built-ins and third-party entry points alike) and lives
on that process's own shared loop (its `LoopManager`), never on Ray's actor loop: each request is handed to
the shared loop with `LoopManager.arun`, so an engine bound to its loop (vLLM's ``AsyncLLM``) always sees
the same one. Ray cancelling a request (``ray.cancel`` on an async actor task) raises ``CancelledError`` in
`call`, which `arun` turns into a cancellation of the engine request.

Replies are ``(True, result)`` or ``(False, error)``: the library's errors travel back as values (they
pickle), so the driver re-raises the very error the hosted backend raised instead of Ray's wrapper of it.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections import Counter
from typing import Any

from ..._loop import get_loop_manager
from ..._protocol import AsyncBackend
from ..._registry import acreate_backend
from ...errors import AsyncBackendsError, BackendError, BackendUnavailableError

__all__ = ["ReplicaActor", "Reply"]

Reply = tuple[bool, Any]
"""``(True, result)`` or ``(False, error)``."""

_METHODS = frozenset({"generate", "loglikelihood", "loglikelihood_rolling"})


def _stdout_to_stderr() -> None:
    """Send what this actor's process writes to standard output to its standard error instead.

    Ray forwards a worker's stdout to the driver's stdout: the logs of the hosted backend (vLLM logs to
    stdout, and so does its engine-core process, which inherits the descriptor) would mix with the output of
    the user's script. Logs belong on stderr, which Ray forwards to the driver's stderr. The actor owns its
    worker process, so redirecting descriptor 1 there touches nothing else.
    """
    sys.stdout.flush()
    os.dup2(2, 1)


class ReplicaActor:
    """Hosts one backend in a Ray actor process.

    Args:
        replica: The replica's index in its backend (for messages only).
    """

    def __init__(self, replica: int) -> None:
        _stdout_to_stderr()
        self.replica = replica
        self._backend: AsyncBackend | None = None
        self._name = "?"
        self.answered: Counter[str | None] = Counter()
        self.in_flight = 0

    def where(self) -> dict[str, Any]:
        """The process and node this actor was placed on."""
        import ray

        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    async def start(self, name: str, options: dict[str, Any]) -> Reply:
        """Build the hosted backend by registry name; reply with what the driver needs to know about it."""
        began = time.monotonic()
        self._name = name
        try:
            backend = await acreate_backend(name, **options)
        except AsyncBackendsError as exc:
            return False, exc
        except Exception as exc:  # an adapter's own bug or a missing dependency in the actor's environment
            return False, BackendError(
                f"building {name!r} in Ray replica {self.replica} failed: {type(exc).__name__}: {exc}",
                backend="ray",
                retryable=False,
            )
        self._backend = backend
        fingerprint = getattr(backend, "fingerprint", None)
        return True, {
            "name": backend.name,
            "capabilities": backend.capabilities,
            "fingerprint": dict(fingerprint) if fingerprint is not None else None,
            "seconds": time.monotonic() - began,
            **self.where(),
        }

    async def call(self, method: str, request: Any) -> Reply:
        """Run one request on the hosted backend, on this process's shared loop."""
        backend = self._backend
        if backend is None or method not in _METHODS:
            return False, BackendError(f"Ray replica {self.replica} cannot run {method!r}", backend="ray")
        function = getattr(backend, method, None)
        if function is None:
            from ...errors import RequestRejectedError

            return False, RequestRejectedError(
                f"backend {self._name!r} does not support {method}",
                backend=self._name,
                request_id=getattr(request, "request_id", None),
            )
        self.in_flight += 1
        try:
            result = await get_loop_manager().arun(function(request))
        except AsyncBackendsError as exc:
            return False, exc
        except Exception as exc:
            return False, BackendError(
                f"{type(exc).__name__} in Ray replica {self.replica}: {exc}",
                backend=self._name,
                request_id=getattr(request, "request_id", None),
            )
        finally:
            self.in_flight -= 1
        self.answered[getattr(request, "request_id", None)] += 1
        return True, result

    async def check_ready(self) -> Reply:
        """The readiness probe: the hosted backend is built and open, and passes its own ``check_ready``."""
        backend = self._backend
        if backend is None or getattr(backend, "closed", False):
            return False, BackendUnavailableError(f"Ray replica {self.replica} hosts no open backend")
        own_check = getattr(backend, "check_ready", None)
        if own_check is None:
            return True, None
        try:
            await get_loop_manager().arun(own_check())
        except AsyncBackendsError as exc:
            return False, exc
        except Exception as exc:
            return False, BackendUnavailableError(f"{type(exc).__name__}: {exc}", backend=self._name)
        return True, None

    def stats(self) -> dict[str, Any]:
        """Requests answered by request id, and requests in flight: what tests and operators count."""
        return {"answered": dict(self.answered), "in_flight": self.in_flight, "pid": os.getpid()}

    async def stop(self) -> None:
        """Close the hosted backend (a vLLM engine shuts down its engine-core process cleanly)."""
        backend, self._backend = self._backend, None
        if backend is not None:
            await get_loop_manager().arun(backend.aclose())
