"""`kvgate compare`: the rollback decision over runs with known answers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gates.metrics import REGISTRY
from gates.rundir import RunData, load_run
from gates.spec import load_gate_file
from reports.compare import rank_test
from reports.compare_cmd import main
from reports.decide import compare_runs, likely_causes
from tests.gates.builder import RunBuilder, batch_waiting, critical, gate_file


def test_rank_biserial_sign_and_size() -> None:
    slow, fast = np.arange(100, 200, dtype=float), np.arange(0, 100, dtype=float)
    p, effect = rank_test(slow, fast)
    assert p < 1e-10 and effect == pytest.approx(1.0)
    p, effect = rank_test(fast, slow)
    assert effect == pytest.approx(-1.0)
    same = np.random.default_rng(1).normal(size=400)
    p, effect = rank_test(same[:200], same[200:])
    assert p > 0.01 and abs(effect) < 0.2


def test_oom_candidate_against_clean_baseline_rolls_back(
    synthetic_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([str(synthetic_runs["oom"]), str(synthetic_runs["clean"]), "--out", str(tmp_path)])
    assert code == 3
    out = capsys.readouterr().out
    assert "decision: ROLLBACK to policy seed, config sha256:seed-config" in out
    decision = json.loads((tmp_path / "rollback.json").read_text())
    assert decision["decision"] == "ROLLBACK" and decision["exit_code"] == 3
    assert decision["rollback_to"] == "sha256:seed-config"
    assert decision["likely_cause"].startswith("estimation bias")
    assert 0.5 <= decision["recommended_admission_watermark"] < 0.82
    gates = {g["id"]: g for g in decision["gates"]}
    assert gates["no_oom"]["candidate"] == "FAIL" and gates["no_oom"]["baseline"] == "PASS"
    ttft = [
        t
        for t in decision["latency"]
        if t["metric"] == "ttft" and t["group"] == "short_qa/critical"
    ]
    assert ttft and ttft[0]["effect"] > 0.3 and ttft[0]["p_value"] < 0.01
    assert (
        decision["reservation"]["candidate"]["under_reserved"]
        > decision["reservation"]["baseline"]["under_reserved"]
    )
    markdown = (tmp_path / "rollback.md").read_text()
    assert "**ROLLBACK**" in markdown and "global admission watermark" in markdown


def test_same_runs_promote(synthetic_runs: dict[str, Path], tmp_path: Path) -> None:
    assert (
        main([str(synthetic_runs["clean"]), str(synthetic_runs["clean"]), "--out", str(tmp_path)])
        == 0
    )
    decision = json.loads((tmp_path / "rollback.json").read_text())
    assert decision["decision"] == "PROMOTE" and decision["rollback_to"] is None
    assert all(not t["regression"] for t in decision["latency"])


def test_invalid_baseline_holds_a_candidate_that_is_only_slower(
    synthetic_runs: dict[str, Path],
) -> None:
    """A baseline whose timings cannot be trusted cannot show that the candidate is slower."""
    baseline = load_run(synthetic_runs["clean"])
    baseline.meta["cpu_warning"] = True
    candidate = load_run(synthetic_runs["clean"])
    events = candidate.server_events
    cancelled = candidate.requests.loc[candidate.requests["cancel_at"].notna(), "request_id"]
    events.loc[events["event"].eq("released") & events["request_id"].isin(cancelled), "t"] += 3.0
    result = compare_runs(candidate, baseline, load_gate_file())
    assert result.decision == "HOLD" and result.exit_code == 4
    assert any("baseline run is INVALID" in r for r in result.reasons)


def test_an_oom_rolls_back_even_to_a_baseline_with_untrusted_timings(
    synthetic_runs: dict[str, Path],
) -> None:
    """The baseline ran without an OOM on a starved load generator: that absence of OOM is no
    timing, so the candidate's OOM still rolls back to it."""
    baseline = load_run(synthetic_runs["clean"])
    baseline.meta["cpu_warning"] = True
    result = compare_runs(load_run(synthetic_runs["oom"]), baseline, load_gate_file())
    assert result.decision == "ROLLBACK" and result.exit_code == 3
    assert any("baseline run is INVALID" in r and "no_oom" in r for r in result.reasons)


def test_release_defect_is_named(synthetic_runs: dict[str, Path]) -> None:
    """A candidate whose only change is slow release: the cause is the runtime release path."""
    baseline = load_run(synthetic_runs["clean"])
    candidate = load_run(synthetic_runs["clean"])  # changed in memory only
    events = candidate.server_events
    late = events["event"].eq("released") & events["request_id"].isin(
        candidate.requests.loc[candidate.requests["cancel_at"].notna(), "request_id"]
    )
    events.loc[late, "t"] += 3.0
    result = compare_runs(candidate, baseline, load_gate_file())
    assert result.decision == "ROLLBACK"
    assert result.likely_cause is not None and result.likely_cause.startswith(
        "a runtime release defect"
    )


def test_compare_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    run = RunBuilder().write(tmp_path / "run")
    assert main([str(run), str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def declared(metric: str) -> dict[str, Any]:
    """A gate pair's fields that come from its metric's registration."""
    d = REGISTRY[metric]
    return {"metric": metric, "timing": d.timing, "cause": d.cause, "cause_weight": d.cause_weight}


def test_gates_without_data_are_no_evidence_of_a_cause() -> None:
    """A candidate whose replicas all died has no releases to measure: that gap must not
    be read as a release defect, while the OOM it failed on points at estimation bias."""
    gates = [
        {
            **declared("oom_events"),
            "id": "no_oom",
            "candidate": "FAIL",
            "baseline": "PASS",
            "candidate_value": 4.0,
            "threshold": "count == 0",
        },
        {
            **declared("cancel_release_latency"),
            "id": "cancel_release_p99",
            "candidate": "INVALID",
            "baseline": "PASS",
            "candidate_value": None,
            "threshold": "p(99) < 2s",
        },
        {
            **declared("memory_return"),
            "id": "memory_back_to_idle",
            "candidate": "INVALID",
            "baseline": "PASS",
            "candidate_value": None,
            "threshold": "max <= 0.05",
        },
    ]
    empty: dict[str, float | None] = {
        "under_reserved": None,
        "over_reserved": None,
        "median_error": None,
    }
    rejections = [
        {
            "reason": "all",
            "priority": "critical",
            "rate_baseline": 0.0,
            "rate_candidate": 0.96,
            "change": 0.96,
        },
    ]
    causes = likely_causes(gates, [], rejections, {"candidate": empty, "baseline": empty})
    assert causes["release_defect"] == []
    scores = {cause: sum(points for points, _ in items) for cause, items in causes.items()}
    assert max(scores, key=lambda cause: scores[cause]) == "estimation_bias", (
        "rejections that follow an OOM are its consequence, not a priority-rule cause"
    )


def test_a_new_failure_points_at_the_cause_its_metric_declares() -> None:
    """Critical questions slower while batch work waits (ttft_under_pressure declares
    priority rules) are evidence for priority rules, and nothing else."""
    gates = [
        {
            **declared("ttft_under_pressure"),
            "id": "priority_under_pressure",
            "candidate": "FAIL",
            "baseline": "PASS",
            "candidate_value": 4.0,
            "threshold": "p(95) <= 900ms",
        }
    ]
    empty: dict[str, float | None] = {
        "under_reserved": None,
        "over_reserved": None,
        "median_error": None,
    }
    causes = likely_causes(gates, [], [], {"candidate": empty, "baseline": empty})
    assert causes["priority_rules"] == [
        (1, "gate priority_under_pressure FAIL (4 vs p(95) <= 900ms)")
    ]
    assert causes["estimation_bias"] == [] and causes["release_defect"] == []


def leaked(run: RunData, every: int = 10) -> RunData:
    """`run` with the release of one cancellation in `every` gone: blocks that leak."""
    events = run.server_events
    cancelled = run.requests.loc[run.requests["cancel_at"].notna(), "request_id"]
    lost = events["event"].eq("released") & events["request_id"].isin(cancelled.iloc[::every])
    run.server_events = events[~lost].reset_index(drop=True)
    return run


def starved(run: RunData) -> RunData:
    run.meta["cpu_warning"] = True
    run.meta["cpu_warnings"] = [{"t": 0, "worker": "local", "cpu_percent": 97}]
    return run


def test_a_leak_on_a_starved_load_generator_rolls_back(synthetic_runs: dict[str, Path]) -> None:
    """Releases that never came (p99 = +inf) are no lateness a busy load generator could
    cause: its CPU warning does not excuse the leak, which the baseline does not have."""
    candidate = starved(leaked(load_run(synthetic_runs["clean"])))
    result = compare_runs(candidate, load_run(synthetic_runs["clean"]), load_gate_file())
    release = next(g for g in result.gates if g["id"] == "cancel_release_p99")
    assert release["candidate"] == "FAIL" and release["candidate_value"] == math.inf
    assert release["baseline"] == "PASS"
    assert result.decision == "ROLLBACK" and result.exit_code == 3
    assert any("fails key gate cancel_release_p99" in r for r in result.reasons)


def test_a_leak_rolls_back_to_a_baseline_with_untrusted_timings(
    synthetic_runs: dict[str, Path],
) -> None:
    """The baseline released everything on a starved load generator: late perhaps, but it
    released. The candidate's leak is no timing, so it rolls back to it."""
    baseline = starved(load_run(synthetic_runs["clean"]))
    result = compare_runs(leaked(load_run(synthetic_runs["clean"])), baseline, load_gate_file())
    assert result.decision == "ROLLBACK"
    assert any("baseline run is INVALID" in r and "cancel_release_p99" in r for r in result.reasons)


def test_a_finite_priority_breach_on_a_starved_load_generator_holds(tmp_path: Path) -> None:
    """ttft_under_pressure is a timing: judged by a key gate, its 4 s on a load generator
    over its CPU budget may be the load generator's lateness, so it holds rather than
    rolling back to a baseline that answered in 0.2 s."""
    gates = load_gate_file(
        gate_file(
            tmp_path / "priority.yaml",
            """
  - id: priority_under_pressure
    title: While lower-priority work waits, P95 TTFT of critical questions stays at most 900 ms
    metric: ttft_under_pressure
    filter: {priority: [critical], traffic_class: [short_qa]}
    pass: "p(95) <= 900ms"
    key: true
    blocks: critical questions waited behind lower-priority work
""",
        )
    )

    def run(name: str, ttft: float) -> RunData:
        b = critical(batch_waiting(RunBuilder(), 20.0, 60.0), 21.0, 100, ttft=ttft)
        return load_run(b.write(tmp_path / name))

    baseline = run("baseline", 0.2)
    assert compare_runs(run("slow", 4.0), baseline, gates).decision == "ROLLBACK"  # trusted
    result = compare_runs(starved(run("slow-starved", 4.0)), baseline, gates)
    assert result.gates[0]["candidate"] == "FAIL" and result.gates[0]["baseline"] == "PASS"
    assert result.decision == "HOLD"
    assert any("CPU warning" in r for r in result.reasons)
