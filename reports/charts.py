"""Inline SVG charts rendered server-side: geometry in Python, markup in jinja2 templates.

Charts take already-aggregated data (time buckets, quantiles, counts), so their size does
not grow with the run. A chart without data renders a plain sentence saying so. Every
drawn datum carries class "mark" so a browser test can tell a drawn chart from an empty one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from jinja2 import Environment, PackageLoader
from markupsafe import Markup

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777")
WIDTH, HEIGHT = 760, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 56
ROTATE_ABOVE, ROTATED_EXTRA = 6, 70  # slant category labels when there are more bars than this

_ENV = Environment(
    loader=PackageLoader("reports", "templates"),
    autoescape=lambda name: name is not None and name.endswith((".html.j2", ".svg.j2")),
    trim_blocks=True,
    keep_trailing_newline=True,
    lstrip_blocks=True,
)


def env() -> Environment:
    return _ENV


@dataclass(slots=True)
class Line:
    name: str
    xs: Sequence[float]
    ys: Sequence[float]


@dataclass(slots=True)
class Rule:
    """A reference line: horizontal at y (watermark, cap, SLO) or vertical at x (fault)."""

    at: float
    label: str
    color: str = "#6b7280"


@dataclass(slots=True)
class LineChart:
    id: str
    title: str
    x_label: str
    y_label: str
    lines: list[Line]
    hrules: list[Rule] = field(default_factory=list)
    vrules: list[Rule] = field(default_factory=list)
    rug: list[tuple[float, float]] = field(
        default_factory=list
    )  # (x, weight 0..1): e.g. rejections
    rug_label: str = ""
    empty: str = "no data"
    caption: str = ""


@dataclass(slots=True)
class BarChart:
    """Grouped bars: `groups[name][i]` is the bar of category i (None: no bar)."""

    id: str
    title: str
    y_label: str
    categories: list[str]
    groups: dict[str, list[float | None]]
    hrules: list[Rule] = field(default_factory=list)
    split_after: int | None = None  # draw a vertical rule after this category (a threshold bin)
    split_label: str = ""
    empty: str = "no data"
    caption: str = ""


@dataclass(frozen=True, slots=True)
class Rendered:
    id: str
    title: str
    svg: Markup | None
    empty: str | None
    caption: str


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(lo / step) * step
    return [
        round(start + i * step, 10)
        for i in range(count + 3)
        if start + i * step <= hi + step * 0.999
    ]


def fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e9:
        return f"{value / 1e9:g}G"
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:g}k"
    return f"{value:.4g}"


class _Scale:
    """Linear map of [lo, hi] onto pixels [a, b]."""

    def __init__(self, lo: float, hi: float, a: float, b: float) -> None:
        self.lo, self.hi, self.a, self.b = lo, hi if hi > lo else lo + 1.0, a, b

    def __call__(self, v: float) -> float:
        return round(self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a), 2)


def _staggered(rules: list[Rule], sy: _Scale) -> list[tuple[float, str, str, float]]:
    """Horizontal rules with label x positions shifted left so close rules' labels don't overlap."""
    ordered = sorted(rules, key=lambda r: r.at)
    return [
        (sy(r.at), r.label, r.color, WIDTH - RIGHT - 4.0 - (i % 3) * 200)
        for i, r in enumerate(ordered)
    ]


def render_line(chart: LineChart) -> Rendered:
    points = [
        (x, y) for ln in chart.lines for x, y in zip(ln.xs, ln.ys, strict=True) if math.isfinite(y)
    ]
    if not points:
        return Rendered(chart.id, chart.title, None, chart.empty, chart.caption)
    xs = [p[0] for p in points] + [r.at for r in chart.vrules]
    ys = [p[1] for p in points] + [r.at for r in chart.hrules] + [0.0]
    yticks = nice_ticks(min(ys), max(ys))
    xticks = nice_ticks(min(xs), max(xs), 8)
    sx = _Scale(xticks[0], xticks[-1], LEFT, WIDTH - RIGHT)
    sy = _Scale(yticks[0], yticks[-1], HEIGHT - BOTTOM, TOP)
    paths = []
    for i, ln in enumerate(chart.lines):
        coords = [f"{sx(x)},{sy(y)}" for x, y in zip(ln.xs, ln.ys, strict=True) if math.isfinite(y)]
        if coords:
            paths.append(
                {"d": "M" + " L".join(coords), "color": PALETTE[i % len(PALETTE)], "name": ln.name}
            )
    context = {
        "chart": chart,
        "width": WIDTH,
        "height": HEIGHT,
        "box": {"x0": LEFT, "x1": WIDTH - RIGHT, "y0": TOP, "y1": HEIGHT - BOTTOM},
        "xticks": [(sx(t), fmt(t)) for t in xticks],
        "yticks": [(sy(t), fmt(t)) for t in yticks],
        "paths": paths,
        "hrules": _staggered(chart.hrules, sy),
        "vrules": [(sx(r.at), r.label, r.color) for r in chart.vrules],
        "rug": [(sx(x), round(0.25 + 0.75 * w, 3)) for x, w in chart.rug],
    }
    svg = Markup(_ENV.get_template("line.svg.j2").render(**context))
    return Rendered(chart.id, chart.title, svg, None, chart.caption)


def render_bars(chart: BarChart) -> Rendered:
    values = [
        v for vals in chart.groups.values() for v in vals if v is not None and math.isfinite(v)
    ]
    if not chart.categories or not values:
        return Rendered(chart.id, chart.title, None, chart.empty, chart.caption)
    ys = [*values, *(r.at for r in chart.hrules), 0.0]
    yticks = nice_ticks(min(ys), max(ys))
    rotate = len(chart.categories) > ROTATE_ABOVE
    height = HEIGHT + (ROTATED_EXTRA if rotate else 0)  # room for slanted category labels
    sy = _Scale(yticks[0], yticks[-1], height - BOTTOM - (ROTATED_EXTRA if rotate else 0), TOP)
    slot = (WIDTH - LEFT - RIGHT) / len(chart.categories)
    names = list(chart.groups)
    bar_w = max(1.0, slot * 0.8 / len(names))
    rects = []
    for ci in range(len(chart.categories)):
        for gi, name in enumerate(names):
            v = chart.groups[name][ci]
            if v is None or not math.isfinite(v):
                continue
            x = LEFT + ci * slot + slot * 0.1 + gi * bar_w
            top, base = sy(max(v, 0.0)), sy(min(v, 0.0))
            rects.append(
                {
                    "x": round(x, 2),
                    "y": top,
                    "w": round(bar_w, 2),
                    "h": round(max(base - top, 0.5), 2),
                    "color": PALETTE[gi % len(PALETTE)],
                    "title": f"{chart.categories[ci]} {name}: {fmt(v)}",
                }
            )
    split = None
    if chart.split_after is not None:
        split = (round(LEFT + (chart.split_after + 1) * slot, 2), chart.split_label)
    context = {
        "chart": chart,
        "width": WIDTH,
        "height": height,
        "box": {"x0": LEFT, "x1": WIDTH - RIGHT, "y0": TOP, "y1": sy(yticks[0])},
        "yticks": [(sy(t), fmt(t)) for t in yticks],
        "zero": sy(0.0),
        "rects": rects,
        "labels": [(round(LEFT + (i + 0.5) * slot, 2), c) for i, c in enumerate(chart.categories)],
        "rotate": rotate,
        "legend": [(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)]
        if len(names) > 1
        else [],
        "hrules": _staggered(chart.hrules, sy),
        "split": split,
    }
    svg = Markup(_ENV.get_template("bars.svg.j2").render(**context))
    return Rendered(chart.id, chart.title, svg, None, chart.caption)


def render(chart: LineChart | BarChart) -> Rendered:
    return render_line(chart) if isinstance(chart, LineChart) else render_bars(chart)
