"""A run's request and attempt with its observer told of their start and end (`_run.Run`, when watched).

Kept apart from the unwatched path, which pays one ``observer is None`` check per request and nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._clock import AttemptClock
from ._observability.observe import RequestObserver, RunObserver, current_request
from ._protocol import BackendMethod
from ._types import Request, Result

if TYPE_CHECKING:
    from ._run import Outcome, Run

__all__ = ["observed_attempt", "watched_one"]


async def watched_one(
    run: Run,
    observer: RunObserver,
    index: int,
    request: Request,
    slot: AttemptClock,
    slot_wait: float,
    key: str | None,
) -> Outcome:
    """`Run.one` with the run's observer told of the request's start and end."""
    watched = observer.request_started(index, request, slot_wait)
    token = current_request.set(watched)  # read by observe.note_replica inside the attempt
    try:
        outcome = await run.one(request, slot, watched, key)
    except BaseException:
        watched.cancelled()
        raise
    finally:
        current_request.reset(token)
    watched.done(outcome)
    return outcome


async def observed_attempt(
    run: Run,
    watched: RequestObserver,
    method: BackendMethod,
    request: Request,
    slot: AttemptClock,
    attempt: int,
) -> Result:
    """`Run.attempt` with the observer told of its start and end."""
    watched.attempt_started(attempt)
    try:
        result = await run.attempt(method, request, slot, attempt)
    except BaseException as exc:
        watched.attempt_ended(attempt, exc)
        raise
    watched.attempt_ended(attempt, None)
    return result
