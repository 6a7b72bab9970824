"""qualify.html: a qualification (the qualify.json object) as one self-contained page.

The page is rendered from the very object written to qualify.json, so the two never
disagree and a saved qualify.json can be rendered again. The number formats live here and
`kvgate qualify` uses them for qualify.md too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reports.build import STATUS_COLORS
from reports.charts import env

# Light backgrounds for the detection matrix's cells; text takes STATUS_COLORS.
TINTS = {
    "PASS": "#dcfce7",
    "MARGINAL": "#fef9c3",
    "FAIL": "#fee2e2",
    "INVALID": "#f3f4f6",
    "N/A": "#ffffff",
}
# A mutant's outcome read as a status: caught by its own gate is what passing means here.
OUTCOME_STATUS = {
    "detected": "PASS",
    "not_stopped": "MARGINAL",
    "by_accident": "MARGINAL",
    "missed": "FAIL",
    "no_verdict": "INVALID",
}
OUTCOME_TEXT = {
    "detected": "detected",
    "not_stopped": "caught, not stopped",
    "by_accident": "by accident",
    "missed": "missed",
    "no_verdict": "no verdict",
}


def rate_text(rate: Mapping[str, Any]) -> str:
    """`1/10 = 10% [1.8%, 40%]`: a count over its runs with the interval of the rate."""
    if not rate["n"]:
        return "not judged"
    lo, hi = rate["interval"]
    return (
        f"{rate['count']}/{rate['n']} = {_percent(rate['rate'])} [{_percent(lo)}, {_percent(hi)}]"
    )


def _percent(share: float) -> str:
    """0.0213 -> 2.1%, 1.0 -> 100%: two significant digits, never in exponent form."""
    value = 100 * share
    return f"{value:.0f}%" if value >= 10 else f"{value:.2g}%"


def margin_text(margin: float | str | None) -> str:
    """A margin in spreads as qualify.json holds it (a number, "inf", "-inf" or null)."""
    if margin is None:
        return "n/a"
    value = float(margin)
    return ("+∞" if value > 0 else "−∞") if math.isinf(value) else f"{value:.2f}"


def write_html(q: Mapping[str, Any], path: Path) -> Path:
    """Render qualify.html at `path` from the qualify.json object `q`."""
    colors = {str(k): v for k, v in STATUS_COLORS.items()}
    html = (
        env()
        .get_template("qualify.html.j2")
        .render(
            q=q,
            color=lambda status: colors.get(status, "#374151"),
            tint=lambda status: TINTS.get(status, "#ffffff"),
            outcome_status=OUTCOME_STATUS,
            outcome_text=OUTCOME_TEXT,
            rate=rate_text,
            margin=margin_text,
            generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        )
    )
    path.write_text(html)
    return path
