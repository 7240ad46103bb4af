"""The router's tuning options, their defaults and their checks (`Router.check_options` reads them here)."""

from __future__ import annotations

from typing import Any

from .._adaptive import AdaptiveConcurrency
from ..errors import InvalidRequestError
from .choice import ROUTINGS

__all__ = ["DEFAULTS", "OPTIONS", "check", "replica_adaptive_settings"]

DEFAULTS: dict[str, Any] = {
    "cooldown": 1.0,
    "max_cooldown": 60.0,
    "wait": 30.0,
    "probe_timeout": 10.0,
    "affinity_chars": 256,
    "affinity_slack": 1.25,
    "seed": None,
    "replica_concurrency": None,
}
"""The router's tuning options (besides ``routing``) and their defaults, in `check`'s order."""

OPTIONS = tuple(DEFAULTS)
"""The router's tuning options (besides ``routing``), as `Router.check_options` accepts them."""


def replica_adaptive_settings(value: object) -> AdaptiveConcurrency | None:
    """The per-replica adaptive settings ``replica_concurrency`` asks for (``"adaptive"``: the defaults).

    Raises:
        InvalidRequestError: ``value`` is neither ``None``, ``"adaptive"`` nor an `AdaptiveConcurrency`.
    """
    if value is None or isinstance(value, AdaptiveConcurrency):
        return value
    if isinstance(value, str) and value == "adaptive":
        return AdaptiveConcurrency()
    raise InvalidRequestError(
        f"replica_concurrency must be 'adaptive', an AdaptiveConcurrency or None, got {value!r}"
    )


def check(
    routing: str,
    cooldown: float,
    max_cooldown: float,
    wait: float,
    probe_timeout: float,
    affinity_chars: int,
    affinity_slack: float,
    seed: Any,  # anything `random.Random` takes
    replica_concurrency: Any,
) -> None:
    """Raise `InvalidRequestError` for a router option out of range (see `Router.check_options`)."""
    if routing not in ROUTINGS:
        raise InvalidRequestError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    for name, value in (("cooldown", cooldown), ("max_cooldown", max_cooldown), ("wait", wait)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise InvalidRequestError(f"{name} must be a number >= 0, got {value!r}")
    if not isinstance(probe_timeout, (int, float)) or not probe_timeout > 0:
        raise InvalidRequestError(f"probe_timeout must be a number > 0, got {probe_timeout!r}")
    if not isinstance(affinity_slack, (int, float)) or not affinity_slack >= 1:
        raise InvalidRequestError(f"affinity_slack must be a number >= 1, got {affinity_slack!r}")
    if not isinstance(affinity_chars, int) or affinity_chars < 1:
        raise InvalidRequestError(f"affinity_chars must be an int >= 1, got {affinity_chars!r}")
    replica_adaptive_settings(replica_concurrency)
