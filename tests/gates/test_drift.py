"""Drift gates: one value per window, judged by the slope per hour with its interval."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gates.estimate import estimate
from gates.evaluator import evaluate_run
from gates.rundir import load_run
from gates.terms import Threshold
from gates.verdict import Status
from reports.build import load_verdict, trend_charts
from reports.charts import LineChart
from tests.gates.builder import T0, RunBuilder

SOAK_GATES = Path(__file__).resolve().parents[2] / "harness" / "plans" / "soak.gates.yaml"
HOUR = 3600.0


def test_the_slope_is_per_hour_with_a_student_t_interval() -> None:
    t = T0 + np.arange(30) * 120.0  # an hour of 2-minute windows
    line = Threshold.model_validate("slope <= 0.02")
    flat = estimate(np.full(30, 0.1) + np.random.default_rng(1).normal(0, 0.001, 30), line, 0.95, t)
    assert abs(flat.value) < 0.01 and flat.lo < flat.value < flat.hi
    rising = estimate(0.1 + 0.05 * (t - T0) / HOUR, line, 0.95, t)
    assert rising.value == pytest.approx(0.05) and rising.method.startswith("least squares")
    two = estimate(np.array([0.1, 0.2]), line, 0.95, t[:2])
    assert two.lo == -np.inf and two.hi == np.inf  # two points fit any line exactly


def soak(hours: float, leak_per_hour: float, rss_mb_per_hour: float = 0.0) -> RunBuilder:
    """A steady soak sampled every 30 s: pool usage with a floor that rises `leak_per_hour`
    over a sawtooth of load, server RSS that grows `rss_mb_per_hour`, answered requests."""
    b = RunBuilder()
    end = 10 + hours * HOUR
    b.meta["t_end"] = T0 + end + 20
    b.meta["windows"] = {
        "idle_before": [T0, T0 + 10],
        "stress": [T0 + 10, T0 + end],
        "after_load": [T0 + end, T0 + end + 20],
    }
    b.sample("kvgate_pool_blocks_total", 1000, 5)
    for i, t in enumerate(np.arange(10, end, 30.0)):
        floor = 0.05 + leak_per_hour * (t - 10) / HOUR
        usage = floor + (0.5 if i % 4 else 0.0)  # every fourth sample at the floor
        b.sample("kvgate_pool_used_blocks", 1000 * usage, float(t))
        rss = 300e6 + rss_mb_per_hour * 1e6 * (t - 10) / HOUR
        b.sample("process_rss_bytes", rss, float(t), target="11", labels="role=replica:r0")
        b.sample("kvgate_gateway_ledger_drift_tokens", 0.0, float(t), target="gateway")
        b.request(f"q{i}", t=float(t), priority="critical", ttft_s=0.2, e2e_s=0.3)
    return b


def drift(run: Path) -> dict[str, Status]:
    verdict = evaluate_run(run, gates_file=SOAK_GATES)
    return {g.id: g.status for g in verdict.gates if g.id.endswith("_flat")}


def test_an_hour_without_drift_passes_every_drift_gate(tmp_path: Path) -> None:
    statuses = drift(soak(1.0, leak_per_hour=0.0).write(tmp_path / "run"))
    assert statuses == dict.fromkeys(
        (
            "memory_floor_flat",
            "server_rss_flat",
            "ledger_drift_flat",
            "ttft_flat",
            "rejections_flat",
        ),
        Status.PASS,
    )


def test_a_leak_and_a_growing_process_fail_their_drift_gates(tmp_path: Path) -> None:
    statuses = drift(soak(1.0, leak_per_hour=0.1, rss_mb_per_hour=600).write(tmp_path / "run"))
    assert statuses["memory_floor_flat"] == Status.FAIL
    assert statuses["server_rss_flat"] == Status.FAIL
    assert statuses["ledger_drift_flat"] == Status.PASS


def test_a_few_minutes_cannot_prove_the_absence_of_drift(tmp_path: Path) -> None:
    statuses = drift(soak(0.1, leak_per_hour=0.0).write(tmp_path / "run"))
    assert statuses["memory_floor_flat"] in (Status.MARGINAL, Status.INVALID)
    assert Status.PASS not in statuses.values()


def test_the_report_draws_each_drift_trend_with_its_fitted_line(tmp_path: Path) -> None:
    from reports import write_reports

    run = soak(1.0, leak_per_hour=0.1).write(tmp_path / "run")
    verdict = evaluate_run(run, gates_file=SOAK_GATES)
    html = write_reports(run, verdict=verdict)["html"].read_text()
    assert 'id="trend-memory_floor_flat"' in html or "trend-memory_floor_flat" in html
    assert html.count("The gate judges the fitted line") >= 4


SOAK_LEAK_GATES = SOAK_GATES.with_name("soak-leak.gates.yaml")  # memory_floor per 30 s


def drift_chart(run: Path, gate_id: str) -> LineChart | None:
    """The report's drift chart of `gate_id`, drawn from the verdict as verdict.json keeps it."""
    data = load_run(run)
    charts = trend_charts(data, load_verdict(run, data))
    return next((c for c in charts if c.id == f"trend-{gate_id}"), None)


def test_the_drift_chart_is_drawn_with_the_gates_own_window(tmp_path: Path) -> None:
    """soak-leak judges memory_floor per 30 s window, not the metric's 120 s: the chart
    shows the windows the gate judged, read from verdict.json."""
    run = soak(0.2, leak_per_hour=0.1).write(tmp_path / "run")  # 12 minutes of load
    verdict = evaluate_run(run, gates_file=SOAK_LEAK_GATES)
    judged = next(g for g in verdict.gates if g.id == "memory_floor_flat")
    chart = drift_chart(run, "memory_floor_flat")
    assert chart is not None
    per_window = next(line for line in chart.lines if line.name == "per window")
    assert len(per_window.xs) == judged.n_samples == 24  # 12 minutes / 30 s, not / 120 s
    assert per_window.xs[1] - per_window.xs[0] == pytest.approx(0.5)  # minutes apart
    assert judged.spec["params"] == {"window_s": 30}


def test_a_soak_aborted_early_keeps_its_drift_chart(tmp_path: Path) -> None:
    """Two and a half minutes of load hold five 30 s windows but not two of 120 s: the
    aborted soak's chart is drawn from the windows its gate judged."""
    b = soak(150 / HOUR, leak_per_hour=2.0)
    b.meta["aborted"] = {"gate": "memory_floor_flat", "at_s": 160.0, "message": "slope"}
    run = b.write(tmp_path / "run")
    verdict = evaluate_run(run, gates_file=SOAK_LEAK_GATES)
    judged = next(g for g in verdict.gates if g.id == "memory_floor_flat")
    assert verdict.status == Status.FAIL and judged.n_samples == 5
    chart = drift_chart(run, "memory_floor_flat")
    assert chart is not None and len(chart.lines[0].xs) == 5
