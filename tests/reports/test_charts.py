"""SVG chart geometry and the no-data case."""

from __future__ import annotations

import math
import re
from itertools import pairwise

from reports.charts import (
    Band,
    BarChart,
    Line,
    LineChart,
    Point,
    Rule,
    ScatterChart,
    log_ticks,
    nice_ticks,
    render,
)


def _first_number(pattern: str, svg: str) -> float:
    """The number in the first group of `pattern`'s first match in `svg`."""
    found = re.search(pattern, svg)
    assert found, f"no match for {pattern!r}"
    return float(found[1])


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


def test_log_ticks_are_one_two_five_per_decade_and_cover_the_range() -> None:
    assert log_ticks(0.3, 31.0) == [0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0]
    wide = log_ticks(0.001, 100.0)
    assert wide == [0.001, 0.01, 0.1, 1.0, 10.0, 100.0], "only powers of ten past 3 decades"


def test_scatter_draws_breaches_censored_strip_threshold_and_faults() -> None:
    chart = ScatterChart(
        "s",
        "T",
        "x",
        "y",
        [Point(1.0, 0.2), Point(2.0, 1.5, breach=True), Point(3.0, 0.4)],
        line=Rule(0.9, "p(95) <= 900ms"),
        censored=[Point(2.5, math.inf, True, "r9: no first token")],
        bands=[Band(1.5, 2.2, "kill r1"), Band(2.8, None, "pause r0")],
    )
    svg = str(render(chart).svg)
    assert svg.count('class="mark point"') == 2 and svg.count('class="mark point breach"') == 1
    assert svg.count('class="mark censored"') == 1 and "r9: no first token" in svg
    assert svg.count('class="band"') == 1, "a fault without an end gets no guessed span"
    assert svg.count('class="rule fault"') == 2
    line_y = _first_number(r'class="rule threshold" data-at="0.9"[^>]*y1="([\d.]+)"', svg)
    breach_y = _first_number(r'class="mark point breach" cx="[\d.]+" cy="([\d.]+)"', svg)
    low_y = max(float(y) for y in re.findall(r'class="mark point" cx="[\d.]+" cy="([\d.]+)"', svg))
    assert breach_y < line_y < low_y  # SVG y grows downward
    # The censored marker sits in the strip above every measured value.
    tip = _first_number(
        r'class="mark censored" d="M[\d.]+,[\d.]+ L[\d.]+,[\d.]+ L[\d.]+,([\d.]+)', svg
    )
    assert tip < breach_y


def test_log_bars_start_at_a_power_of_ten_and_emphasise_highlighted_labels() -> None:
    chart = BarChart(
        "b",
        "T",
        "y",
        ["short_qa/critical", "batch/batch"],
        {"p95": [0.3, 31.0]},
        log=True,
        highlight=["short_qa/critical"],
    )
    svg = str(render(chart).svg)
    heights = [float(h) for h in re.findall(r'class="mark"[^>]*height="([\d.]+)"', svg)]
    assert len(heights) == 2 and heights[1] / heights[0] < 10  # linear: about 100
    assert re.search(r'class="tick highlight"[^>]*>short_qa/critical<', svg)
    assert re.search(r'class="tick"[^>]*>0.1<', svg), "the axis starts at the decade below"
