"""Building a run's observers: OpenTelemetry where an SDK is set up, the run's callbacks where given.

The interface lives in `observe`, which knows none of its implementations; the gathering entry points call
`watch` here, so the run builds its observers and the interface module imports nothing back.
"""

from __future__ import annotations

from typing import Any

from . import telemetry
from .callbacks import CallbackObserver
from .observe import Fanout, RunObserver

__all__ = ["run_observer", "watch"]


def run_observer(backend: Any, callbacks: Any = None, *, parent_context: Any = None) -> RunObserver | None:
    """The observer for one run of ``backend``: ``None`` when nothing watches.

    Args:
        backend: The run's backend (its name, model and address label the telemetry).
        callbacks: The run's `RunCallbacks`, or ``None``.
        parent_context: The caller's OpenTelemetry context, captured with
            `telemetry.capture_context` in the caller's thread (the run itself executes on the
            shared loop's thread, where the caller's active span is not current).
    """
    parts: list[RunObserver] = []
    otel = telemetry.otel_observer(backend, parent_context)
    if otel is not None:
        parts.append(otel)
    if callbacks is not None:
        parts.append(CallbackObserver(backend, callbacks))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else Fanout(parts)


def watch(backend: Any, options: Any) -> RunObserver | None:
    """The observer for a run of ``backend`` with `RunOptions` ``options``, made in the caller's thread.

    The gathering entry points call this before handing the run to the shared loop, so the caller's active
    OpenTelemetry span (current in the caller's thread or task, not on the loop's thread) is the parent.
    """
    return run_observer(backend, options.callbacks, parent_context=telemetry.capture_context())
