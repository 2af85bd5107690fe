"""Server-side SVG charts: the reward histogram and the pass@k curve. No script, no library.

    bins = histogram([0.0, 0.5, 1.0, 1.0], bins=10)
    svg = reward_histogram_svg(bins)          # Markup, safe to place in a template
    svg = pass_at_k_svg([{"k": 1, "value": 0.5}, {"k": 2, "value": 0.75}])

Every label goes through `escape`, so a number formatted oddly can never become markup.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

WIDTH, HEIGHT = 420, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 14, 36


@dataclass(frozen=True)
class Bin:
    low: float
    high: float
    count: int


def histogram(values: Iterable[float], *, bins: int = 10) -> list[Bin]:
    """Equal-width bins over [min, max]; the last bin includes max. One bin if all equal."""
    data = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    if not data:
        return []
    low, high = min(data), max(data)
    if low == high:
        return [Bin(low, high, len(data))]
    width = (high - low) / bins
    counts = [0] * bins
    for value in data:
        counts[min(int((value - low) / width), bins - 1)] += 1
    return [Bin(low + i * width, low + (i + 1) * width, c) for i, c in enumerate(counts)]


def _label(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def _frame(title: str, body: list[str]) -> Markup:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        *body,
        "</svg>",
    ]
    return Markup("".join(parts))


def _note(text: str) -> str:
    return (
        f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="note">'
        f"{escape(text)}</text>"
    )


def _axes(y_ticks: Sequence[tuple[float, str]]) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    out = [
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" stroke="#8a94a6"/>',
        f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" '
        f'y2="{HEIGHT - BOTTOM}" stroke="#8a94a6"/>',
    ]
    for fraction, text in y_ticks:
        y = TOP + plot_h * (1 - fraction)
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
            f'stroke="#e6e9ee"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(text)}</text>'
        )
    return out


def reward_histogram_svg(bins: Sequence[Bin]) -> Markup:
    """Bars of how many graded attempts fell in each reward range."""
    title = "Reward histogram"
    if not bins:
        return _frame(title, [_note("no graded attempts yet")])
    tallest = max(b.count for b in bins) or 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    # Whole-number ticks at most four steps apart, and the axis ends on the last tick, so
    # every label sits exactly at the height of its count.
    step = math.ceil(tallest / 4)
    top = step * math.ceil(tallest / step)
    ticks = [(count / top, str(count)) for count in range(0, top + 1, step)]
    body = _axes(ticks)
    slot = plot_w / len(bins)
    for i, b in enumerate(bins):
        h = plot_h * b.count / top
        x = LEFT + i * slot
        tip = f"{_label(b.low)} to {_label(b.high)}: {b.count}"
        body.append(
            f'<rect class="bar" x="{x + 1:.1f}" y="{TOP + plot_h - h:.1f}" '
            f'width="{max(slot - 2, 1):.1f}" height="{h:.1f}" fill="#2f5bd3" '
            f'data-count="{b.count}"><title>{escape(tip)}</title></rect>'
        )
    # One bin (every reward equal) gets one label under its middle, not the same one twice.
    edges = (
        [(bins[0].low, LEFT + plot_w / 2)]
        if len(bins) == 1
        else [(bins[0].low, LEFT), (bins[-1].high, WIDTH - RIGHT)]
    )
    for value, x in edges:
        body.append(
            f'<text x="{x}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
            f"{escape(_label(value))}</text>"
        )
    body.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 4}" text-anchor="middle">reward</text>'
    )
    return _frame(title, body)


def pass_at_k_svg(points: Sequence[Mapping[str, Any]]) -> Markup:
    """pass@k against k (log scale, k = 1, 2, 4, ...), y from 0 to 100%."""
    title = "pass@k"
    usable = sorted((int(p["k"]), float(p["value"])) for p in points if p.get("value") is not None)
    if not usable:
        return _frame(title, [_note("no curve: pass@k needs n ≥ 2 attempts per row")])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    body = _axes([(i / 4, f"{i * 25}%") for i in range(5)])
    span = math.log2(usable[-1][0]) or 1.0

    def xy(k: int, value: float) -> tuple[float, float]:
        x = LEFT + 16 + (plot_w - 32) * (math.log2(k) / span if len(usable) > 1 else 0.5)
        return x, TOP + plot_h * (1 - value)

    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(k, v) for k, v in usable))
    body.append(f'<polyline points="{line}" fill="none" stroke="#2f5bd3" stroke-width="2"/>')
    for k, value in usable:
        x, y = xy(k, value)
        tip = f"pass@{k}: {value * 100:.1f}%"
        body.append(
            f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#2f5bd3" '
            f'data-k="{k}" data-value="{value:.6f}"><title>{escape(tip)}</title></circle>'
            f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{k}</text>'
        )
    body.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 4}" text-anchor="middle">k</text>')
    return _frame(title, body)
