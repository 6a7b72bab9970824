"""Every report shows each gate's value with its interval and n, and flags a verdict the
evidence cannot settle; the critical TTFT chart draws the line the run was judged by."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gates.verdict import Status
from reports import write_reports
from tests.gates.builder import RunBuilder
from tests.reports.verdicts import TTFT_TITLE, oom_gate, straddling_ttft_gate, ttft_gate, verdict


def critical_run(path: Path, ttfts: Sequence[float | None], **more: Any) -> Path:
    """A run of critical short_qa requests one second apart from the load start (t = 10)."""
    b = RunBuilder()
    for i, ttft in enumerate(ttfts):
        outcome = "ok" if ttft is not None else "timeout"
        b.request(f"c{i}", t=10.0 + i, priority="critical", ttft_s=ttft, outcome=outcome)
    b.request("batch0", t=12.0, traffic_class="batch", priority="batch", ttft_s=31.0)
    b.fault(15.0, target="r1", kind="kill", t_end=18.0)
    for name, value in more.items():
        b.meta[name] = value
    return b.write(path)


def test_a_pass_summary_still_shows_every_gate_with_its_interval(tmp_path: Path) -> None:
    path = critical_run(tmp_path / "run", [0.3, 0.4])
    summary = write_reports(path, verdict=verdict(Status.PASS, oom_gate(), ttft_gate(needs_n=90)))[
        "markdown"
    ].read_text()
    lines = summary.splitlines()
    assert lines[0].startswith("## kvgate: **PASS**"), "the verdict line comes first"
    header = lines.index("| gate | key | status | value [95% interval] | n | threshold |")
    rows = lines[header + 2 : header + 4]
    assert rows[
        0
    ] == "| Zero OOM during the stress window | key | PASS | count = 0, n = 40 | 40 |" + (
        " `count == 0` |"
    )
    assert rows[1] == (
        f"| {TTFT_TITLE} | key | PASS | p(95) = 0.56 s [0.49, 0.71], n = 127 | 127 "
        "| `p(95) <= 900ms` |"
    )
    # A PASS is conclusive: no caveat, and no "needs more samples" even when one was computed.
    assert "⚠" not in summary and "needs >=" not in summary
    assert "did not pass" not in summary


def test_a_straddling_gate_is_flagged_in_the_summary_and_the_html(tmp_path: Path) -> None:
    marginal = straddling_ttft_gate()
    failing = oom_gate(status=Status.FAIL, value=2.0, evidence=[{"t": 1_000_050.0, "value": 1.0}])
    path = critical_run(tmp_path / "run", [0.3, 0.95])
    paths = write_reports(path, verdict=verdict(Status.FAIL, oom_gate(), marginal, failing))
    summary = paths["markdown"].read_text()
    row = next(line for line in summary.splitlines() if line.startswith(f"| {TTFT_TITLE} |"))
    assert "| MARGINAL | p(95) = 0.86 s [0.79, 0.95], n = 127" in row
    assert "**⚠ interval straddles the line**" in row and "**⚠ needs >= 480 samples**" in row
    # The table puts what did not pass first, worst first; the evidence follows it.
    statuses = re.findall(
        r"^\| [^|]+ \| (?:key)? \| (PASS|MARGINAL|FAIL|INVALID) \|", summary, re.MULTILINE
    )
    assert statuses == ["FAIL", "MARGINAL", "PASS"]
    assert summary.index("| gate |") < summary.index("### Gates that did not pass")
    assert "**Zero OOM during the stress window** (`no_oom`, FAIL)" in summary
    assert "- evidence: t=13:47:30 UTC (+50.0 s) value=1" in summary

    html = paths["html"].read_text()
    rows = re.findall(
        r'<tr data-gate="ttft_critical_p95" data-straddles="(\w+)">(.*?)</tr>', html, re.S
    )
    assert len(rows) == 2, "in the failed-gates table and in the table of all gates"
    for straddles, cells in rows:
        assert straddles == "true"
        assert "p(95) = 0.86 s [0.79, 0.95], n = 127" in cells
        assert "interval straddles the line" in cells and "needs &gt;= 480 samples" in cells
    passing = re.search(r'<tr data-gate="no_oom" data-straddles="false">(.*?)</tr>', html, re.S)
    assert passing is not None and "straddles" not in passing.group(1)


def test_critical_ttft_chart_draws_the_ttft_gates_threshold(tmp_path: Path) -> None:
    """The line is the verdict's ttft gate's threshold (here 700 ms, not the built-in 900 ms);
    requests over it are breaches, and the fault is drawn from the faults table."""
    ttfts = [0.2, 0.5, 0.75, 0.65, 1.4, 0.3]
    path = critical_run(tmp_path / "run", ttfts)
    strict = ttft_gate(threshold="p(95) <= 700ms", status=Status.FAIL, value=1.2)
    paths = write_reports(path, verdict=verdict(Status.FAIL, strict))
    html = paths["html"].read_text()
    figure = re.search(r'<figure id="chart-critical_ttft".*?</figure>', html, re.S)
    assert figure is not None
    chart = figure.group(0)
    assert re.search(r'<line class="rule threshold" data-at="0.7"', chart)
    assert "ttft_critical_p95: p(95) &lt;= 700ms" in chart
    assert chart.count('class="mark point breach"') == 2  # 0.75 s and 1.4 s
    assert chart.count('class="mark point"') == 4
    assert "kill r1" in chart and 'class="band"' in chart
    data = json.loads(paths["json"].read_text())["data"]["critical_ttft"]
    assert data["threshold_s"] == pytest.approx(0.7) and data["threshold_from"] == "verdict"
    assert data["n"] == 6 and data["over_line"] == 2
    # The batch request's 31 s is not on this chart: only the gate's requests are.
    assert "batch0" not in chart


def test_without_a_ttft_gate_the_chart_uses_the_built_in_line_and_says_so(
    tmp_path: Path,
) -> None:
    path = critical_run(tmp_path / "run", [0.2, 1.0])
    paths = write_reports(path, verdict=verdict(Status.PASS, oom_gate()))
    chart = re.search(
        r'<figure id="chart-critical_ttft".*?</figure>', paths["html"].read_text(), re.S
    )
    assert chart is not None
    assert 'data-at="0.9"' in chart.group(0) and "from the built-in gates" in chart.group(0)
    data = json.loads(paths["json"].read_text())["data"]["critical_ttft"]
    assert data["threshold_from"] == "built-in gates" and data["over_line"] == 1


def test_ttft_by_class_uses_a_log_axis_so_the_gated_class_is_not_flattened(
    tmp_path: Path,
) -> None:
    """Critical short_qa at ~0.3 s next to batch at 31 s: on a log axis the short bar is still
    a sizeable share of the chart's height, and the gated class's label is emphasised."""
    path = critical_run(tmp_path / "run", [0.3, 0.3, 0.3])
    html = write_reports(path, verdict=verdict(Status.PASS, ttft_gate()))["html"].read_text()
    chart = re.search(r'<figure id="chart-ttft".*?</figure>', html, re.S)
    assert chart is not None
    heights = {
        group: float(height)
        for height, group in re.findall(
            r'height="([\d.]+)" fill="#2563eb"><title>(\S+) p50:', chart.group(0)
        )
    }
    # On a linear axis the ratio would be 31 / 0.3, about 100.
    assert heights["batch/batch"] / heights["short_qa/critical"] < 10
    assert re.search(r'class="tick highlight"[^>]*>short_qa/critical<', chart.group(0))
    assert not re.search(r'class="tick highlight"[^>]*>batch/batch<', chart.group(0))


def test_requests_without_a_first_token_sit_in_the_top_strip_as_breaches(tmp_path: Path) -> None:
    path = critical_run(tmp_path / "run", [0.3, None, 0.4, None])
    paths = write_reports(path, verdict=verdict(Status.FAIL, ttft_gate(status=Status.FAIL)))
    chart = re.search(
        r'<figure id="chart-critical_ttft".*?</figure>', paths["html"].read_text(), re.S
    )
    assert chart is not None
    assert chart.group(0).count('class="mark censored"') == 2
    assert "no first token (a breach) (2)" in chart.group(0)
    data = json.loads(paths["json"].read_text())["data"]["critical_ttft"]
    assert data["no_first_token"] == 2 and data["n"] == 4


@pytest.mark.parametrize("status", [Status.FAIL, Status.INVALID])
def test_the_value_text_is_the_one_rendering_of_a_value(tmp_path: Path, status: Status) -> None:
    """A censored percentile is +inf, not "no data"; no data is said as such."""
    gate = ttft_gate(status=status, value=float("inf"), interval=[0.8, float("inf")], censored=9)
    if status == Status.INVALID:
        gate = ttft_gate(status=status, value=None, interval=None, n_samples=0)
    path = critical_run(tmp_path / "run", [0.3])
    paths = write_reports(path, verdict=verdict(status, gate))
    expected = gate.value_text()
    assert expected in paths["markdown"].read_text()
    assert expected in paths["html"].read_text()
