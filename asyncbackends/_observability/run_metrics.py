"""`RunMetrics`: what one gathering run did, filled in by `gather` as it goes.

Pass one to `gather(..., metrics=m)` (or `run_batch`) and read it afterwards, or watch it live through
``on_update``; the CLI prints its `summary`. It depends on nothing: export it wherever you like.
"""

from __future__ import annotations

import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._types import GenerationResult
from .._usage import Pricing
from ..errors import ContextLengthError

__all__ = ["RunMetrics", "thinking_of"]


def thinking_of(result: Any) -> tuple[int, int]:
    """A generation result's thinking tokens and its completions cut off while thinking (0, 0 if none)."""
    completions = getattr(result, "completions", ())
    return sum(c.reasoning_tokens for c in completions), sum(c.reasoning_truncated for c in completions)


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    # Nearest-rank on the sorted list: simple, and exact for the sizes an eval run produces.
    k = max(0, min(len(sorted_values) - 1, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


@dataclass
class RunMetrics:
    """Counters and latencies of one run.

    Attributes:
        requests: Requests in the run.
        successes: Requests that ended in a result (cache hits included).
        cache_hits: Results read from the cache instead of sent.
        cache_read_failures: Stored results that could not be read back, so their requests were sent again.
        retries: Attempts beyond each request's first.
        retried_errors: The errors that caused those retries, by type name.
        errors: Failed requests by error type name.
        context_length_errors: Failed requests whose prompt plus ``max_tokens`` did not fit the model
            (`ContextLengthError`, never retried): the eval's inputs to fix, not the server's failures.
        prompt_tokens: Prompt tokens over all results that reported them.
        cached_prompt_tokens: Of those, the tokens read from a prefix or provider prompt cache (where backends
            report them: vLLM in process and served, OpenAI's ``cached_tokens``).
        completion_tokens: Generated tokens over all results (thinking included).
        reasoning_tokens: Of those, the tokens reasoning models spent thinking (where backends report them).
        reasoning_truncated: Completions cut off while thinking (no answer: ``max_tokens`` came first).
        cost: What the results cost at the backend's `Pricing` (`Pricing.cost` of each result's usage,
            results read from the cache included: a resumed run's cost is the whole run's); ``None`` when the
            backend has no pricing.
        concurrency_limit: The run's concurrency limit now: the fixed one, or where the adaptive one stands.
        concurrency_changes: How often the adaptive limit moved, by reason ("rate_limited", "overloaded",
            "clean_round", "queueing").
        on_update: Called with this object after each finished request (progress postfix, exporters).

    A pool's per-replica figures join the summary after ``metrics.track_replicas(pool)`` (the CLI does it).
    """

    requests: int = 0
    successes: int = 0
    cache_hits: int = 0
    cache_read_failures: int = 0
    retries: int = 0
    retried_errors: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    context_length_errors: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    reasoning_truncated: int = 0
    cost: float | None = None
    concurrency_limit: int | None = None
    concurrency_changes: Counter[str] = field(default_factory=Counter)
    on_update: Callable[[RunMetrics], None] | None = None
    started: float | None = None
    finished: float | None = None
    _latencies: array[float] = field(default_factory=lambda: array("d"))
    _queue_times: array[float] = field(default_factory=lambda: array("d"))
    _limits: list[tuple[float, int, str]] = field(default_factory=list, repr=False)
    _replica_source: Callable[[], Any] | None = field(default=None, repr=False)
    _replica_base: dict[str, tuple[int, int, int, int]] = field(default_factory=dict, repr=False)

    def track_replicas(self, backend: Any) -> None:
        """Report a pool's per-replica figures in `summary` and `format`, counted from now.

        Does nothing for a backend without ``replica_stats()`` (anything but a pool), so it is safe to call
        on any backend.
        """
        stats = getattr(backend, "replica_stats", None)
        if not callable(stats):
            return
        self._replica_source = stats
        self._replica_base = {s.label: (s.requests, s.successes, s.failures, s.cooldowns) for s in stats()}

    def replicas(self) -> dict[str, dict[str, Any]]:
        """Per-replica figures since `track_replicas`, by replica label.

        Requests (attempts sent), successes, failures and cool-downs since then; in flight and state now,
        and ``limit``, the replica's own adaptive limit now, where the pool keeps one per replica. Empty when
        no pool is tracked.
        """
        if self._replica_source is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for s in self._replica_source():
            base = self._replica_base.get(s.label, (0, 0, 0, 0))
            out[s.label] = {
                "requests": s.requests - base[0],
                "successes": s.successes - base[1],
                "failures": s.failures - base[2],
                "cooldowns": s.cooldowns - base[3],
                "in_flight": s.in_flight,
                "state": s.state,
            }
            if s.limit is not None:
                out[s.label]["limit"] = s.limit
        return out

    def _record_outcome(self, outcome: object, pricing: Pricing | None = None, batch: bool = False) -> None:
        """Count one request's end: its error by type, or a success, its tokens and (priced) its cost."""
        if isinstance(outcome, BaseException):
            self.errors[type(outcome).__name__] += 1
            if isinstance(outcome, ContextLengthError):
                self.context_length_errors += 1
            return
        self.successes += 1
        if isinstance(outcome, GenerationResult):
            self.prompt_tokens += outcome.prompt_tokens or 0
            self.cached_prompt_tokens += outcome.cached_prompt_tokens or 0
            self.completion_tokens += outcome.completion_tokens
            thinking, cut_off = thinking_of(outcome)
            self.reasoning_tokens += thinking
            self.reasoning_truncated += cut_off
            if pricing is not None:
                self.cost = (self.cost or 0.0) + pricing.cost(outcome.usage, batch=batch)

    def _record_latency(self, seconds: float, queued: float) -> None:
        self._latencies.append(seconds)
        self._queue_times.append(queued)

    def _record_limit(self, at: float, limit: int, reason: str) -> None:
        self.concurrency_limit = limit
        self.concurrency_changes[reason] += 1
        self._limits.append((at, limit, reason))

    @property
    def limit_history(self) -> list[tuple[float, int, str]]:
        """Each move of the adaptive limit: (seconds since the run started, new limit, reason)."""
        return list(self._limits)

    @property
    def failed(self) -> int:
        """Requests that ended in an error."""
        return sum(self.errors.values())

    @property
    def elapsed(self) -> float:
        """Seconds from the run's start to its end (or to now while it runs)."""
        if self.started is None:
            return 0.0
        return (self.finished if self.finished is not None else time.perf_counter()) - self.started

    def summary(self) -> dict[str, Any]:
        """A plain dict of the run: counts, rates, latency p50/p95/p99 (seconds) and time in queue."""
        latencies = sorted(self._latencies)
        queued = sorted(self._queue_times)
        elapsed = self.elapsed
        done = self.successes + self.failed
        summary: dict[str, Any] = {
            "requests": self.requests,
            "successes": self.successes,
            "failed": self.failed,
            "errors": dict(self.errors),
            "context_length_errors": self.context_length_errors,
            "retries": self.retries,
            "retried_errors": dict(self.retried_errors),
            "cache_hits": self.cache_hits,
            "cache_read_failures": self.cache_read_failures,
            "elapsed_s": elapsed,
            "requests_per_s": done / elapsed if elapsed > 0 else None,
            "latency_p50_s": _percentile(latencies, 50),
            "latency_p95_s": _percentile(latencies, 95),
            "latency_p99_s": _percentile(latencies, 99),
            "queue_p50_s": _percentile(queued, 50),
            "queue_p95_s": _percentile(queued, 95),
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "completion_tokens_per_s": self.completion_tokens / elapsed if elapsed > 0 else None,
            "reasoning_tokens": self.reasoning_tokens,
            "reasoning_truncated": self.reasoning_truncated,
            "cost": self.cost,
            "concurrency_limit": self.concurrency_limit,
            "concurrency_changes": dict(self.concurrency_changes),
        }
        if self._limits:
            limits = [limit for _, limit, _ in self._limits]
            summary["concurrency_lowest"], summary["concurrency_highest"] = min(limits), max(limits)
        replicas = self.replicas()
        if replicas:
            summary["replicas"] = replicas
        return summary

    def format(self) -> str:
        """A few human-readable lines of `summary`, as the CLI prints them."""
        s = self.summary()

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1000:.1f} ms"

        rate = "-" if s["requests_per_s"] is None else f"{s['requests_per_s']:.1f} req/s"
        tps = "-" if s["completion_tokens_per_s"] is None else f"{s['completion_tokens_per_s']:.1f} tok/s"
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(s["errors"].items())) or "none"
        too_long = s["context_length_errors"]
        lines = [
            f"requests: {s['requests']}  ok: {s['successes']}  failed: {s['failed']}  "
            + (f"(too long for the model: {too_long})  " if too_long else "")
            + f"retries: {s['retries']}  cache hits: {s['cache_hits']}"
            + (f"  cache read failures: {s['cache_read_failures']}" if s["cache_read_failures"] else ""),
            f"errors: {errors}",
            f"elapsed: {s['elapsed_s']:.2f} s  rate: {rate}  generated: {s['completion_tokens']} ({tps})",
            f"latency p50: {ms(s['latency_p50_s'])}  p95: {ms(s['latency_p95_s'])}  "
            f"p99: {ms(s['latency_p99_s'])}  queue p50: {ms(s['queue_p50_s'])}",
        ]
        if s["cached_prompt_tokens"] or s["cost"] is not None:
            share = s["cached_prompt_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else 0.0
            lines.append(
                f"prompt: {s['prompt_tokens']} tokens, {s['cached_prompt_tokens']} cached ({share:.0%})"
                + ("" if s["cost"] is None else f"  cost: {s['cost']:.4f}")
            )
        if s["reasoning_tokens"] or s["reasoning_truncated"]:
            lines.append(
                f"thinking: {s['reasoning_tokens']} tokens  "
                f"cut off while thinking: {s['reasoning_truncated']}"
            )
        if s["concurrency_changes"]:
            moves = ", ".join(f"{k}: {v}" for k, v in sorted(s["concurrency_changes"].items()))
            lines.append(
                f"concurrency (adaptive): {s['concurrency_limit']}  range: {s['concurrency_lowest']}-"
                f"{s['concurrency_highest']}  changes: {moves}"
            )
        for label, r in s.get("replicas", {}).items():
            limit = f"  limit: {r['limit']}" if "limit" in r else ""
            lines.append(
                f"replica {label}: {r['state']}  requests: {r['requests']}  ok: {r['successes']}  "
                f"failed: {r['failures']}  cool-downs: {r['cooldowns']}  in flight: {r['in_flight']}{limit}"
            )
        return "\n".join(lines)
