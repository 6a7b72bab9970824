"""Capacity runs: the curve per step, goodput at the SLO, the capacity gates."""

from __future__ import annotations

from pathlib import Path

from gates.evaluator import evaluate_run
from gates.metrics_capacity import curve
from gates.rundir import load_run
from gates.verdict import Status
from tests.gates.builder import T0, RunBuilder

CAPACITY_GATES = Path(__file__).resolve().parents[2] / "gates" / "capacity.yaml"


def ramp(knee_users: int | None) -> RunBuilder:
    """Steps of 10 s at 10, 20 .. 60 users; each sends 10 requests per user-step; from the
    knee on, half the critical requests take 3 s to their first token."""
    b = RunBuilder()
    steps = []
    for i, users in enumerate(range(10, 70, 10)):
        t0 = 10 + 10 * i
        past = knee_users is not None and users >= knee_users
        for j in range(users):
            slow = past and j % 2 == 0
            b.request(
                f"s{i}-{j}", t=t0 + j * 10 / users, priority="critical",
                ttft_s=3.0 if slow else 0.2, e2e_s=3.5 if slow else 0.5, itl_mean_s=0.02,
            )  # fmt: skip
        steps.append({"index": i, "users": users, "t0": T0 + t0, "t1": T0 + t0 + 10,
                      "requests": users, "rejected_capacity": 0, "rejected_policy": 0})  # fmt: skip
    b.meta["capacity"] = {"steps": steps, "slo_broken_users": knee_users}
    return b


def test_the_curve_has_throughput_and_goodput_per_step(tmp_path: Path) -> None:
    table = curve(load_run(ramp(knee_users=40).write(tmp_path / "run")))
    assert list(table["users"]) == [10, 20, 30, 40, 50, 60]
    assert table.loc[2, "completed_per_s"] == 3.0 and table.loc[2, "goodput_per_s"] == 3.0
    assert table.loc[3, "goodput_per_s"] == 2.0  # half of 40 late: half the goodput
    assert table.loc[3, "ttft_p95_critical"] > 0.9 > table.loc[2, "ttft_p95_critical"]


def test_the_capacity_gates_judge_the_last_load_below_every_knee(tmp_path: Path) -> None:
    weak = evaluate_run(ramp(knee_users=40).write(tmp_path / "weak"), gates_file=CAPACITY_GATES)
    gates = {g.id: g for g in weak.gates}
    assert gates["capacity_at_slo"].value == 30 and gates["capacity_at_slo"].status == Status.FAIL
    assert weak.status == Status.FAIL
    assert gates["ttft_critical_p95"].status == Status.NA  # judged per step instead
    strong = evaluate_run(ramp(knee_users=None).write(tmp_path / "ok"), gates_file=CAPACITY_GATES)
    held = {g.id: g for g in strong.gates}
    assert held["capacity_at_slo"].value == 60 and held["capacity_at_slo"].status == Status.PASS
    assert held["goodput_at_slo"].value == 6.0 and held["goodput_at_slo"].status == Status.PASS


def test_the_summary_shows_the_capacity_curve(tmp_path: Path) -> None:
    from reports import write_reports

    summary = write_reports(ramp(knee_users=40).write(tmp_path / "run"))["markdown"].read_text()
    assert "### Capacity, step by step" in summary and "| 40 | 40 | 4.00 | 2.00 |" in summary


def test_capacity_runs_side_by_side(tmp_path: Path) -> None:
    from reports.capacity_cmd import main

    weak, strong = ramp(knee_users=40), ramp(knee_users=None)
    weak.meta["target"] = {"kind": "reference", "policy": "vllm"}
    strong.meta["target"] = {"kind": "reference", "policy": "seed"}
    paths = [weak.write(tmp_path / "vllm"), strong.write(tmp_path / "seed")]
    assert main([*map(str, paths), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "capacity.md").read_text()
    assert "| vllm | 30 |" in text and "| seed | 60 |" in text and "2.00x" in text
    assert "<svg" in (tmp_path / "out" / "capacity.html").read_text()
    assert main([str(tmp_path / "missing")]) == 2


def test_every_stage_counts_an_unanswered_request_as_the_ttft_gate_does(tmp_path: Path) -> None:
    """One request per ending, status and first token: the ttft gate's values, the capacity
    curve's and the SLO knee's (contract.quantiles.censored_latency) are the same numbers."""
    import itertools

    from contract import Outcome
    from contract.quantiles import censored_latency
    from gates.metrics_requests import ttft
    from gates.stats import percentile
    from gates.terms import GateFilter

    b = RunBuilder()
    statuses = (None, 200, 400, 429, 500, 503)
    # chunks 0 with no first token: a stream that carried no content (+inf if it says ok)
    cases = [
        (outcome, status, first, 0 if first is None else 1)
        for outcome, status, first in itertools.product(Outcome, statuses, (None, 0.25))
    ]
    for i, (outcome, status, first, chunks) in enumerate(cases):
        b.request(
            f"q{i}", t=20, outcome=outcome.value, http_status=status, ttft_s=first, chunks=chunks
        )
    b.meta["capacity"] = {"steps": [{"index": 0, "users": 10, "t0": T0 + 10, "t1": T0 + 30}]}
    run = load_run(b.write(tmp_path / "run"))
    gate = ttft(run, GateFilter(), {}).frame.set_index("request_id")["value"].to_dict()
    knee = {
        f"q{i}": value
        for i, case in enumerate(cases)
        if (value := censored_latency(case[2], case[0], case[1], case[3])) is not None
    }
    assert gate == knee and float("inf") in knee.values() and len(knee) < len(cases)
    step = curve(run).iloc[0]
    assert step["ttft_p95_interactive"] == percentile(list(knee.values()), 95) == float("inf")
    assert step["ttft_p50_interactive"] == percentile(list(knee.values()), 50) == 0.25
