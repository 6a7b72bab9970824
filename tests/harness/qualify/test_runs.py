"""A series of runs: the distribution of verdicts and each gate's margin in spreads."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gates.evidence import Effect, Finding
from harness.qualify.runs import markdown, run_once, summarise


def record(status: str, ttft: float | str, oom_status: str = "PASS") -> dict[str, object]:
    return {
        "run_dir": f"runs/{status}-{ttft}",
        "exit_code": {"PASS": 0, "FAIL": 3}[status],
        "wall_s": 200.0,
        "status": status,
        "problems": [],
        "sim_lag_ms_p99": 12.0,
        "cpu_warning": False,
        "gates": {
            "ttft": {
                "status": "PASS" if ttft != "inf" and float(ttft) <= 0.9 else "FAIL",
                "value": ttft,
                "interval": [0.4, 0.7],
                "n": 300,
                "censored": 0,
                "threshold": "p(95) <= 900ms",
                "key": True,
            },
            "no_oom": {
                "status": oom_status,
                "value": 0.0 if oom_status == "PASS" else 1.0,
                "interval": None,
                "n": 4000,
                "censored": 0,
                "threshold": "count == 0",
                "key": True,
            },
        },
    }


def test_summary_counts_verdicts_and_measures_the_margin_in_spreads() -> None:
    runs = [record("PASS", 0.5), record("PASS", 0.6), record("PASS", 0.7)]
    summary = summarise(runs)
    assert summary["runs"] == 3 and summary["verdicts"] == {"PASS": 3}
    ttft = summary["gates"]["ttft"]
    # mean 0.6, stdev 0.1: the line at 0.9 is 3 spreads away
    assert ttft["margin_spreads"] == pytest.approx(3.0)
    assert ttft["statuses"] == {"PASS": 3} and ttft["not_pass"] == 0
    table = markdown(summary, "plan.yaml", ["target.policy=seed"])
    assert "3 runs: PASS 3" in table and "| ttft | yes | PASS 3 |" in table and "3.00" in table


def test_a_censored_run_has_no_finite_margin_and_counts_as_a_false_alarm() -> None:
    summary = summarise([record("PASS", 0.5), record("FAIL", "inf", oom_status="FAIL")])
    ttft = summary["gates"]["ttft"]
    assert ttft["margin_spreads"] == "-inf" and ttft["values"] == [0.5, "inf"]
    assert summary["gates"]["no_oom"]["not_pass"] == 1
    steady = summarise([record("PASS", 0.5), record("PASS", 0.5)])["gates"]["no_oom"]
    assert steady["margin_spreads"] == "inf"  # count == 0 in every run: nowhere near failing
    json.dumps(summary, allow_nan=False)  # JSON-safe: no NaN/Infinity literals
    assert math.isinf(float(ttft["values"][1]))


def test_a_runs_record_keeps_the_evidence_problems_of_its_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `kvgate run` wrote is read back: the run's problems, and those of them the
    evidence checks raised (effect invalid; a note is not a problem)."""
    clocks = Finding("clock_offset", Effect.INVALID, "clocks disagree by 2.5 s", "requests", "t")
    twice = Finding("unique_request_ids", Effect.NOTE, "dropped 2 rows written twice")
    run_dir = tmp_path / "mutant-x"

    def kvgate_run(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        run_dir.mkdir()
        verdict = {
            "status": "INVALID",
            "run_problems": ["the load generator hit its CPU warning", clocks.text()],
            "gates": [],
            "evidence": {
                "checks": [{"name": "clock_offset", "description": "", "clean": False}],
                "findings": [clocks.to_dict(), twice.to_dict()],
            },
        }
        (run_dir / "verdict.json").write_text(json.dumps(verdict))
        (run_dir / "meta.json").write_text(json.dumps({"sim_lag_ms_p99": 2.0}))
        return subprocess.CompletedProcess(command, 5, "", "")

    monkeypatch.setattr(subprocess, "run", kvgate_run)
    record = run_once("plan.yaml", [], run_dir)
    assert record["status"] == "INVALID" and record["exit_code"] == 5
    assert record["evidence_problems"] == ["clock_offset: clocks disagree by 2.5 s [requests.t]"]
    assert len(record["problems"]) == 2
