"""A run's report: one self-contained HTML page (inline SVG charts, no script, nothing fetched).

``asyncbackends report run.jsonl`` reads the file that ``asyncbackends run ... --metrics-file run.jsonl``
wrote (see `runlog.RunLog`) and draws throughput over time, the latency distribution, retries
and errors by reason, and a line per replica where the backend was a pool.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

from ..errors import InvalidRequestError
from .svg import bar_chart, column_chart

__all__ = ["RunData", "load_run", "render_report", "write_report"]


@dataclass
class RunData:
    """What a metrics file holds: its header, one record per finished request and per retry, its end."""

    header: dict[str, Any] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None

    @property
    def elapsed(self) -> float:
        """Seconds the run lasted (to its last event when it did not end cleanly)."""
        if self.end is not None:
            return float(self.end["t"])
        return max((float(r["t"]) for r in [*self.requests, *self.retries]), default=0.0)


def load_run(path: str | Path) -> RunData:
    """Read a metrics file.

    Raises:
        InvalidRequestError: A line is not JSON or not an event of a metrics file.
    """
    data = RunData()
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                kind = record["event"]
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidRequestError(f"{path}:{number}: not a metrics-file line ({exc})") from exc
            if kind == "run":
                data.header = record
            elif kind == "request":
                data.requests.append(record)
            elif kind == "retry":
                data.retries.append(record)
            elif kind == "end":
                data.end = record
    if not data.header:
        raise InvalidRequestError(f"{path}: no 'run' line: not written by --metrics-file")
    return data


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _throughput(data: RunData) -> str:
    elapsed = max(data.elapsed, 1e-9)
    bins = max(1, min(60, len(data.requests) // 5 or 1))
    width = elapsed / bins
    ok, failed = [0.0] * bins, [0.0] * bins
    tokens = [0.0] * bins
    for record in data.requests:
        slot = min(bins - 1, int(float(record["t"]) / width))
        (failed if record.get("error") else ok)[slot] += 1 / width
        tokens[slot] += (record.get("output_tokens") or 0) / width
    labels = [f"{(i + 0.5) * width:.3g}" for i in range(bins)]
    chart = column_chart(
        labels, [("ok", ok), ("failed", failed)], y_label="requests / s", x_label="seconds since start"
    )
    if any(tokens):
        chart += column_chart(
            labels, [("generated tokens / s", tokens)], y_label="tokens / s", x_label="seconds since start"
        )
    return chart


def _latency_bins(latencies: list[float], bins: int = 30) -> tuple[list[str], list[float], str]:
    """Labels, counts and unit of the latency histogram: ``bins`` equal columns from the fastest to p99.

    The columns span the observed range rather than start at zero, so latencies close together (all
    between 199.9 and 204.0 ms) spread over the columns instead of filling one. Latencies above p99 get
    one more column, labelled ``> p99``, only when there are any.
    """
    low, high = min(latencies), _quantile(latencies, 0.99) or 0.0
    if high <= low:  # every latency equal (p99 is the fastest): one narrow column holds them all
        high = low + max(abs(low) * 1e-3, 1e-9)
    width = (high - low) / bins
    counts = [0.0] * bins
    above = 0
    for value in latencies:
        if value > high:
            above += 1
        else:
            counts[min(bins - 1, int((value - low) / width))] += 1
    scale, unit = (1000.0, "ms") if high < 1 else (1.0, "s")
    # Enough decimals to tell neighbouring columns apart (0.14 ms wide columns need two).
    decimals = min(6, max(0, 1 - math.floor(math.log10(width * scale))))
    labels = [f"{(low + (i + 0.5) * width) * scale:.{decimals}f}" for i in range(bins)]
    if above:
        labels.append(f"> {high * scale:.{decimals}f}")
        counts.append(float(above))
    return labels, counts, unit


def _latency_histogram(latencies: list[float]) -> str:
    if not latencies:
        return '<p class="none">no request was sent (all from the cache)</p>'
    labels, counts, unit = _latency_bins(latencies)
    tail = "; the last column holds everything above p99" if labels[-1].startswith(">") else ""
    x_label = f"latency ({unit}, from the fastest to p99{tail})"
    return column_chart(labels, [("requests", counts)], y_label="requests", x_label=x_label)


def _replica_table(data: RunData) -> str:
    by_replica: dict[str, list[dict[str, Any]]] = {}
    for record in data.requests:
        if record.get("replica"):
            by_replica.setdefault(str(record["replica"]), []).append(record)
    if not by_replica:
        return ""
    retries = Counter(str(r["replica"]) for r in data.retries if r.get("replica"))
    rows = []
    for name, records in sorted(by_replica.items()):
        latencies = [float(r["latency_s"]) for r in records]
        errors = sum(1 for r in records if r.get("error"))
        p50, p95 = (_duration(_quantile(latencies, q)) for q in (0.5, 0.95))
        rows.append(
            f"<tr><td>{escape(name)}</td><td>{len(records)}</td><td>{errors}</td><td>{retries[name]}</td>"
            f"<td>{p50}</td><td>{p95}</td></tr>"
        )
    chart = bar_chart(
        [(name, float(len(records))) for name, records in sorted(by_replica.items())],
        x_label="requests served (last attempt)",
    )
    return (
        "<h2>Per replica</h2>"
        "<table><tr><th>replica</th><th>requests</th><th>errors</th><th>retries</th><th>p50</th><th>p95</th></tr>"
        + "".join(rows)
        + "</table>"
        + chart
    )


_STYLE = """
body { font-family: sans-serif; max-width: 700px; margin: 2em auto; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { padding: 2px 10px; border-bottom: 1px solid #ddd; }
th { text-align: left; } td { text-align: right; } td:first-child { text-align: left; }
.none { color: #777; } svg { display: block; margin: 0.5em 0; }
"""


def _concurrency_rows(data: RunData) -> list[tuple[str, str]]:
    """The adaptive limit's rows, from the run's closing summary: where it ended, its range, its moves."""
    summary = (data.end or {}).get("summary") or {}
    changes = summary.get("concurrency_changes") or {}
    if not changes:
        limit = summary.get("concurrency_limit")
        return [] if limit is None else [("concurrency", str(limit))]
    moves = ", ".join(f"{reason}: {count}" for reason, count in sorted(changes.items()))
    return [
        (
            "concurrency (adaptive)",
            f"{summary.get('concurrency_limit')} at the end, "
            f"{summary.get('concurrency_lowest')} to {summary.get('concurrency_highest')} during the run",
        ),
        ("concurrency changes by reason", moves),
    ]


def _cached_rows(requests: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Prompt tokens read from a cache, where the backend reported them."""
    cached = [int(r["cached_input_tokens"]) for r in requests if r.get("cached_input_tokens") is not None]
    if not cached:
        return []
    prompt = sum(int(r.get("input_tokens") or 0) for r in requests)
    share = f" ({sum(cached) / prompt:.0%} of the prompt tokens)" if prompt else ""
    return [("of which read from a cache", f"{sum(cached)}{share}")]


def _cost_rows(data: RunData) -> list[tuple[str, str]]:
    """What the run cost at the backend's prices (the closing summary's), where it had prices."""
    cost = ((data.end or {}).get("summary") or {}).get("cost")
    return [] if cost is None else [("cost (at the stated prices)", f"{float(cost):.4f}")]


def _thinking_rows(requests: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Thinking tokens and answers cut off while thinking, where the run had a reasoning model."""
    thinking = sum(int(r.get("reasoning_tokens") or 0) for r in requests)
    cut_off = sum(int(r.get("reasoning_truncated") or 0) for r in requests)
    if not thinking and not cut_off:
        return []
    return [("of which thinking", str(thinking)), ("cut off while thinking (no answer)", str(cut_off))]


def render_report(data: RunData) -> str:
    """The report of one run as a complete HTML document."""
    header = data.header
    requests = data.requests
    elapsed = data.elapsed
    sent = [r for r in requests if not r.get("cached")]
    latencies = [float(r["latency_s"]) for r in sent]
    errors = Counter(str(r["error"]) for r in requests if r.get("error"))
    reasons = Counter(str(r["reason"]) for r in data.retries)
    slot_waits = [float(r.get("slot_wait_s") or 0.0) for r in requests]
    rate_wait = sum(float(r.get("rate_wait_s") or 0.0) for r in requests)
    output_tokens = sum(int(r.get("output_tokens") or 0) for r in requests)
    started = datetime.fromtimestamp(float(header.get("started_at", 0.0)), UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
    title = f"{header.get('backend', '?')}" + (f" · {header['model']}" if header.get("model") else "")
    summary = [
        ("started", started),
        ("requests", f"{len(requests)} finished of {header.get('requests', '?')}"),
        ("ok / failed", f"{len(requests) - sum(errors.values())} / {sum(errors.values())}"),
        ("retries", str(len(data.retries))),
        ("cache hits", str(sum(1 for r in requests if r.get("cached")))),
        ("elapsed", f"{elapsed:.2f} s" + ("" if data.end else " (the run did not finish)")),
        ("throughput", f"{len(requests) / elapsed:.1f} req/s" if elapsed > 0 else "-"),
        (
            "generated tokens",
            f"{output_tokens}" + (f" ({output_tokens / elapsed:.1f} tok/s)" if elapsed > 0 else ""),
        ),
        *_thinking_rows(requests),
        *_cached_rows(requests),
        *_cost_rows(data),
        (
            "latency p50 / p95 / p99",
            " / ".join(_duration(_quantile(latencies, q)) for q in (0.5, 0.95, 0.99)),
        ),
        (
            "waiting for a worker p50 / p95",
            " / ".join(_duration(_quantile(slot_waits, q)) for q in (0.5, 0.95)),
        ),
        ("held by the rate limiter (total)", _duration(rate_wait)),
        *_concurrency_rows(data),
    ]
    rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in summary)
    body = [
        f"<h1>Run report: {escape(title)}</h1>",
        f"<table>{rows}</table>",
        "<h2>Throughput over time</h2>",
        _throughput(data) if requests else '<p class="none">no request finished</p>',
        "<h2>Latency distribution</h2>",
        _latency_histogram(latencies),
        "<h2>Retries by reason</h2>",
        bar_chart(reasons.most_common(), x_label="retries"),
        "<h2>Errors by type</h2>",
        bar_chart(errors.most_common(), x_label="failed requests"),
        _replica_table(data),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>asyncbackends run report: {escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def write_report(source: str | Path, target: str | Path) -> None:
    """Read the metrics file ``source`` and write its HTML report to ``target``."""
    Path(target).write_text(render_report(load_run(source)), encoding="utf-8")
