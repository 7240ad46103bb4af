"""Small inline SVG charts for the run report: no JavaScript, no fonts or files fetched, just markup."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

__all__ = ["bar_chart", "column_chart", "nice_ceiling"]

WIDTH, HEIGHT = 640, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 12, 12, 40
_COLOURS = ("#3b6ea8", "#d9822b", "#5a9e5a", "#b04a4a", "#7a5aa8")


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``value`` (an axis top that reads well)."""
    if value <= 0:
        return 1.0
    scale = 10.0 ** int(f"{value:e}".split("e")[1])
    for step in (1, 2, 2.5, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale  # pragma: no cover


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def column_chart(
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    y_label: str,
    x_label: str,
    stacked: bool = True,
) -> str:
    """Vertical columns, one per label, each stacking the series' values (a legend names the series).

    Args:
        labels: One label per column (only a few are printed when there are many).
        series: ``(name, values)``; every ``values`` as long as ``labels``.
        y_label: The vertical axis' title.
        x_label: The horizontal axis' title.
        stacked: Stack the series; otherwise only the first is drawn as columns and the others as lines.
    """
    count = max(1, len(labels))
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    if stacked:
        top = max((sum(vals[i] for _, vals in series) for i in range(len(labels))), default=0.0)
    else:
        top = max((max(vals, default=0.0) for _, vals in series), default=0.0)
    top = nice_ceiling(top)
    step = plot_w / count
    parts = [_frame(top, y_label, x_label)]
    base = [0.0] * len(labels)
    for number, (_, values) in enumerate(series):
        colour = _COLOURS[number % len(_COLOURS)]
        if stacked or number == 0:
            for i, value in enumerate(values):
                if value <= 0:
                    continue
                h = value / top * plot_h
                y = _TOP + plot_h - (base[i] / top * plot_h) - h
                x = _LEFT + i * step + step * 0.1
                parts.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(step * 0.8, 0.8):.1f}" '
                    f'height="{h:.1f}" fill="{colour}"/>'
                )
                if stacked:
                    base[i] += value
        else:
            points = " ".join(
                f"{_LEFT + (i + 0.5) * step:.1f},{_TOP + plot_h - v / top * plot_h:.1f}"
                for i, v in enumerate(values)
            )
            parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
    shown = max(1, count // 8)
    for i, label in enumerate(labels):
        if i % shown == 0:
            x = _LEFT + (i + 0.5) * step
            parts.append(
                f'<text x="{x:.1f}" y="{HEIGHT - _BOTTOM + 14}" text-anchor="middle">{escape(label)}</text>'
            )
    parts.append(_legend([name for name, _ in series]))
    return _svg(parts)


def bar_chart(items: Sequence[tuple[str, float]], *, x_label: str) -> str:
    """Horizontal bars, one per ``(label, value)``, largest first as given."""
    if not items:
        return '<p class="none">none</p>'
    row = 22
    height = _TOP + row * len(items) + 30
    left = 200
    plot_w = WIDTH - left - 60
    top = nice_ceiling(max(v for _, v in items))
    parts = []
    for i, (label, value) in enumerate(items):
        y = _TOP + i * row
        w = value / top * plot_w
        parts.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
        parts.append(
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{_COLOURS[0]}"/>'
        )
        parts.append(f'<text x="{left + w + 4:.1f}" y="{y + 15}">{_number(value)}</text>')
    parts.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 6}" text-anchor="middle">{escape(x_label)}</text>'
    )
    return _svg(parts, height)


def _frame(top: float, y_label: str, x_label: str) -> str:
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    lines = []
    for k in range(5):
        value = top * k / 4
        y = _TOP + plot_h - plot_h * k / 4
        lines.append(f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        lines.append(f'<text x="{_LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{_number(value)}</text>')
    lines.append(
        f'<text x="14" y="{_TOP + plot_h / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {_TOP + plot_h / 2:.0f})">{escape(y_label)}</text>'
    )
    lines.append(
        f'<text x="{_LEFT + plot_w / 2:.0f}" y="{HEIGHT - 4}" text-anchor="middle">{escape(x_label)}</text>'
    )
    return "".join(lines)


def _legend(names: Sequence[str]) -> str:
    if len(names) < 2:
        return ""
    parts = []
    x = _LEFT + 8
    for number, name in enumerate(names):
        colour = _COLOURS[number % len(_COLOURS)]
        parts.append(f'<rect x="{x}" y="{_TOP + 2}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{x + 14}" y="{_TOP + 11}">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    return "".join(parts)


def _svg(parts: Sequence[str], height: int = HEIGHT) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
        f'height="{height}" font-family="sans-serif" font-size="11">' + "".join(parts) + "</svg>"
    )
