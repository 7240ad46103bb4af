"""The run's OpenTelemetry instruments, made once per meter provider (see `telemetry`)."""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["DURATION_BUCKETS", "TOKEN_BUCKETS", "Instruments", "instruments_of"]


DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
"""``gen_ai.client.operation.duration`` boundaries (seconds), as the GenAI semantic conventions advise."""
TOKEN_BUCKETS = tuple(4**k for k in range(14))
"""``gen_ai.client.token.usage`` boundaries: 1, 4, 16, ... 67108864, as the conventions advise."""
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
_SCOPE = "asyncbackends"


def _version() -> str:
    from .._version import __version__

    return __version__


class _Tally:
    """Counts kept as plain ints on the loop thread and read by an observable instrument when collected.

    Counting this way costs a dict look-up per event instead of an SDK measurement (attribute checks,
    hashing, locks: several microseconds each), for counters nobody needs per event.
    """

    def __init__(self) -> None:
        self.counts: dict[tuple[Any, ...], list[Any]] = {}  # key -> [attributes, count]

    def add(self, key: tuple[Any, ...], attributes: dict[str, Any], amount: int) -> None:
        entry = self.counts.get(key)
        if entry is None:
            entry = self.counts[key] = [attributes, 0]
        entry[1] += amount

    def observe(self, options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        # list(): the loop thread may add a key while the collecting thread reads.
        return [Observation(count, attributes) for attributes, count in list(self.counts.values())]


class Instruments:
    """One meter provider's instruments, made once (making them per run would warn of duplicates)."""

    def __init__(self, provider: Any) -> None:
        self.in_flight, self.retries, self.cache_hits = _Tally(), _Tally(), _Tally()
        meter = provider.get_meter(_SCOPE, _version())
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS),
        )
        meter.create_observable_up_down_counter(
            "asyncbackends.requests.in_flight",
            callbacks=[self.in_flight.observe],
            unit="{request}",
            description="Requests a worker is serving",
        )
        self.slot_wait = meter.create_histogram(
            "asyncbackends.slot.wait.duration",
            unit="s",
            description="Time a request waited in the run's queue for a free worker",
            explicit_bucket_boundaries_advisory=list(_WAIT_BUCKETS),
        )
        self.rate_wait = meter.create_histogram(
            "asyncbackends.rate_limit.wait.duration",
            unit="s",
            description="Time the run's rate limiter held an attempt back",
            explicit_bucket_boundaries_advisory=list(_WAIT_BUCKETS),
        )
        meter.create_observable_counter(
            "asyncbackends.retries",
            callbacks=[self.retries.observe],
            unit="{retry}",
            description="Retried attempts, by the error that caused them",
        )
        meter.create_observable_counter(
            "asyncbackends.cache.hits",
            callbacks=[self.cache_hits.observe],
            unit="{request}",
            description="Results read from the response cache",
        )
        self.concurrency_limit = meter.create_gauge(
            "asyncbackends.concurrency.limit",
            unit="{request}",
            description="Where a run's adaptive concurrency limit stands",
        )
        self.concurrency_changes = meter.create_counter(
            "asyncbackends.concurrency.changes",
            unit="{change}",
            description="Moves of the adaptive concurrency limit, by reason",
        )
        self.replica_state = meter.create_gauge(
            "asyncbackends.replica.state",
            unit="1",
            description="1 for the state a pool's replica is in, 0 for the states it left",
        )
        self.replica_limit = meter.create_gauge(
            "asyncbackends.replica.concurrency.limit",
            unit="{request}",
            description="Where a pool replica's own adaptive concurrency limit stands",
        )


_instruments: weakref.WeakKeyDictionary[Any, Instruments] = weakref.WeakKeyDictionary()


def instruments_of(provider: Any) -> Instruments:
    found = _instruments.get(provider)
    if found is None:
        found = _instruments[provider] = Instruments(provider)
    return found
