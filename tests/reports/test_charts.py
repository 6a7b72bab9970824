"""SVG chart geometry and the no-data case."""

from __future__ import annotations

import math
from itertools import pairwise

from reports.charts import BarChart, Line, LineChart, Rule, nice_ticks, render


def test_nice_ticks_cover_the_range() -> None:
    ticks = nice_ticks(0.03, 0.97)
    assert ticks[0] <= 0.03 and ticks[-1] >= 0.97
    assert all(b > a for a, b in pairwise(ticks))


def test_line_chart_draws_paths_rules_and_rug() -> None:
    chart = LineChart(
        "c",
        "T",
        "x",
        "y",
        [Line("r0", [0, 1, 2], [0.1, 0.5, math.nan])],
        hrules=[Rule(0.82, "wm")],
        vrules=[Rule(1.5, "kill r1")],
        rug=[(1.0, 1.0)],
    )
    out = render(chart)
    assert out.svg is not None and out.empty is None
    svg = str(out.svg)
    assert svg.count('class="mark"') == 1 and svg.count('class="mark rug"') == 1
    assert "kill r1" in svg and "wm" in svg


def test_bar_chart_handles_negative_values_and_missing_bars() -> None:
    chart = BarChart("b", "T", "y", ["a", "b"], {"median": [-0.2, 0.3], "p95": [None, 0.5]})
    svg = str(render(chart).svg)
    assert svg.count('class="mark"') == 3


def test_empty_charts_render_no_svg_but_say_why() -> None:
    out = render(LineChart("c", "T", "x", "y", [Line("r0", [], [])], empty="no samples"))
    assert out.svg is None and out.empty == "no samples"
    assert render(BarChart("b", "T", "y", [], {})).svg is None


def test_labels_are_escaped() -> None:
    chart = BarChart("b", "T", "y", ["<script>"], {"n": [1.0]})
    svg = str(render(chart).svg)
    assert "<script>" not in svg and "&lt;script&gt;" in svg
