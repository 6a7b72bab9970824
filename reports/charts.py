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
    # A log y axis keeps small bars readable next to bars 100x taller (bars then start at
    # the axis floor, not at 0); values <= 0 are not drawn on it.
    log: bool = False
    highlight: list[str] = field(default_factory=list)  # categories whose label is emphasised


@dataclass(slots=True)
class Point:
    """One observation of a scatter; `breach` draws it as over the line."""

    x: float
    y: float
    breach: bool = False
    title: str = ""


@dataclass(slots=True)
class Band:
    """A shaded time span with a line at its start (a fault from injection to recovery)."""

    x0: float
    x1: float | None
    label: str
    color: str = "#7c3aed"


@dataclass(slots=True)
class ScatterChart:
    """Points over time on a log y axis, a threshold line, and observations without a value
    (`censored`: x positions) drawn as markers along the top edge."""

    id: str
    title: str
    x_label: str
    y_label: str
    points: list[Point]
    line: Rule | None = None
    censored: list[Point] = field(default_factory=list)
    censored_label: str = "no value"
    bands: list[Band] = field(default_factory=list)
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


def log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks per decade covering [lo, hi] (both > 0); only powers of ten past 3 decades."""
    lo, hi = max(lo, 1e-12), max(hi, lo * 1.0001)
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1.0,) if last - first > 3 else (1.0, 2.0, 5.0)
    ticks = [round(m * 10.0**e, 12) for e in range(first, last + 1) for m in steps]
    below = [t for t in ticks if t <= lo]
    above = [t for t in ticks if t >= hi]
    start, stop = below[-1] if below else ticks[0], above[0] if above else ticks[-1]
    return [t for t in ticks if start <= t <= stop]


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


class _LogScale(_Scale):
    """Log10 map of [lo, hi] (both > 0) onto pixels [a, b]."""

    def __init__(self, lo: float, hi: float, a: float, b: float) -> None:
        super().__init__(math.log10(lo), math.log10(hi), a, b)

    def __call__(self, v: float) -> float:
        return super().__call__(math.log10(v))


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
    def drawable(v: float | None) -> bool:
        return v is not None and math.isfinite(v) and (v > 0 or not chart.log)

    values = [v for vals in chart.groups.values() for v in vals if v is not None and drawable(v)]
    if not chart.categories or not values:
        return Rendered(chart.id, chart.title, None, chart.empty, chart.caption)
    rotate = len(chart.categories) > ROTATE_ABOVE
    height = HEIGHT + (ROTATED_EXTRA if rotate else 0)  # room for slanted category labels
    floor_px = height - BOTTOM - (ROTATED_EXTRA if rotate else 0)
    rules = [r for r in chart.hrules if drawable(r.at)]
    sy: _Scale
    if chart.log:
        ys = [*values, *(r.at for r in rules)]
        # Start at a power of ten, so a bar's height still says something about its size.
        yticks = log_ticks(10 ** math.floor(math.log10(min(ys))), max(ys))
        sy = _LogScale(yticks[0], yticks[-1], floor_px, TOP)
    else:
        ys = [*values, *(r.at for r in rules), 0.0]
        yticks = nice_ticks(min(ys), max(ys))
        sy = _Scale(yticks[0], yticks[-1], floor_px, TOP)
    base_value = yticks[0] if chart.log else 0.0  # where a bar starts
    slot = (WIDTH - LEFT - RIGHT) / len(chart.categories)
    names = list(chart.groups)
    bar_w = max(1.0, slot * 0.8 / len(names))
    rects = []
    for ci in range(len(chart.categories)):
        for gi, name in enumerate(names):
            v = chart.groups[name][ci]
            if v is None or not drawable(v):
                continue
            x = LEFT + ci * slot + slot * 0.1 + gi * bar_w
            top, base = sy(max(v, base_value)), sy(min(v, base_value))
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
        "zero": sy(base_value),
        "rects": rects,
        "labels": [
            (round(LEFT + (i + 0.5) * slot, 2), c, c in chart.highlight)
            for i, c in enumerate(chart.categories)
        ],
        "rotate": rotate,
        "legend": [(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)]
        if len(names) > 1
        else [],
        "hrules": _staggered(rules, sy),
        "split": split,
    }
    svg = Markup(_ENV.get_template("bars.svg.j2").render(**context))
    return Rendered(chart.id, chart.title, svg, None, chart.caption)


UNDER, OVER = "#2563eb", "#dc2626"
STRIP = 16  # px along the top edge for observations without a value


def render_scatter(chart: ScatterChart) -> Rendered:
    if not chart.points and not chart.censored:
        return Rendered(chart.id, chart.title, None, chart.empty, chart.caption)
    ys = [p.y for p in chart.points if p.y > 0 and math.isfinite(p.y)]
    if chart.line is not None and chart.line.at > 0:
        ys.append(chart.line.at)
    yticks = log_ticks(min(ys), max(ys)) if ys else [0.1, 1.0]
    xs = [p.x for p in (*chart.points, *chart.censored)]
    xs += [b.x0 for b in chart.bands] + [b.x1 for b in chart.bands if b.x1 is not None]
    xticks = nice_ticks(min(xs), max(xs), 8)
    sx = _Scale(xticks[0], xticks[-1], LEFT, WIDTH - RIGHT)
    # Censored observations have no y: they sit in a strip above the axis's top tick, so
    # they can never be read as a measured latency.
    top = TOP + (STRIP if chart.censored else 0)
    sy = _LogScale(yticks[0], yticks[-1], HEIGHT - BOTTOM, top + (4 if chart.censored else 0))
    floor = yticks[0]
    points = [
        {
            "x": sx(p.x),
            "y": sy(max(p.y, floor)),
            "breach": p.breach,
            "color": OVER if p.breach else UNDER,
            "title": p.title,
        }
        for p in chart.points
    ]
    # Draw breaches last so they are never hidden under the (many) points below the line.
    points.sort(key=lambda p: bool(p["breach"]))
    strip_y = TOP + STRIP / 2
    censored = [{"x": sx(p.x), "title": p.title} for p in chart.censored]
    right = WIDTH - RIGHT
    bands = [
        {
            "x0": sx(b.x0),
            # A fault without a recorded end gets its line only: no guess at how long it lasted.
            "w": 0.0 if b.x1 is None else round(max(sx(b.x1) - sx(b.x0), 1.0), 2),
            "label": b.label,
            "color": b.color,
            "label_y": HEIGHT - BOTTOM - 4 - (i % 3) * 12,
            "anchor": "end" if sx(b.x0) > right - 120 else "start",
        }
        for i, b in enumerate(chart.bands)
    ]
    n_breach = sum(p.breach for p in chart.points)
    legend = [
        ("circle", UNDER, f"at or under the line ({len(chart.points) - n_breach})"),
        ("circle", OVER, f"over the line ({n_breach})"),
    ]
    if chart.censored:
        legend.append(("triangle", OVER, f"{chart.censored_label} ({len(chart.censored)})"))
    line = None
    if chart.line is not None and chart.line.at > 0:
        line = {"y": sy(chart.line.at), "at": chart.line.at, "label": chart.line.label}
        line["color"] = chart.line.color
    context = {
        "chart": chart,
        "width": WIDTH,
        "height": HEIGHT,
        "box": {"x0": LEFT, "x1": right, "y0": TOP, "y1": HEIGHT - BOTTOM},
        "xticks": [(sx(t), fmt(t)) for t in xticks],
        "yticks": [(sy(t), fmt(t)) for t in yticks],
        "points": points,
        "censored": censored,
        "strip": {"y": strip_y, "edge": top} if chart.censored else None,
        "bands": bands,
        "line": line,
        "legend": legend,
    }
    svg = Markup(_ENV.get_template("scatter.svg.j2").render(**context))
    return Rendered(chart.id, chart.title, svg, None, chart.caption)


def render(chart: LineChart | BarChart | ScatterChart) -> Rendered:
    if isinstance(chart, ScatterChart):
        return render_scatter(chart)
    return render_line(chart) if isinstance(chart, LineChart) else render_bars(chart)
