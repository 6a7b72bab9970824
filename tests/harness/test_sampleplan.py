"""The sample plan: requests counted from a plan's users, wait times and phases; a previous
run's counts in place of the assumed latencies; `kvgate plan check`'s table and exit codes;
`kvgate run --strict` refusing a load too short before it starts anything.

The plans here cap every request's latency by its own timeout or cancellation, so what
they send does not hang on the assumed latencies: a user of short_qa_critical with
wait_time 1.5 and timeout_s 0.5 starts a task every 2 s, whatever the server's speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gates.spec import load_gate_file
from harness.plan import Plan, load_plan
from harness.plan_cmd import main as plan_main
from harness.run_cmd import main as run_main
from harness.sampleplan import LoadTooShort, announce, measure, sample_plan
from harness.sampleplan.expect import Reach, Source
from harness.sampleplan.report import EXIT_OK, EXIT_SHORT, EXIT_UNKNOWN
from harness.sampleplan.traffic import distribute, model
from harness.traffic import build_user_classes
from tests.cli_helpers import ROOT, kvgate
from tests.gates.builder import FINISHED, RunBuilder

# 4 critical users: 2 questions a second; 2 storm users, 5 cancelled requests each every 2 s.
PLAN = """
name: tiny
target: {type: reference, replicas: 1}
traffic:
  classes:
    short_qa_critical: {fixed_count: 4, attributes: {wait_time: 1.5, timeout_s: 0.5}}
    cancel_storm:
      fixed_count: 2
      attributes: {burst_size: 5, cancel_after_ms: 100, wait_time: 1.9}
load: {users: 6, spawn_rate: 1000, duration_s: 60}
faults:
  - {kind: kill, at_s: 10, replica: r0, restart_after_s: 1}
"""
# Critical questions only at the peaks (2 x 10 s), interactive ones all along (60 s).
PHASED = """
name: phased
target: {type: reference, replicas: 1}
traffic:
  classes:
    short_qa_critical:
      fixed_count: 2
      attributes: {wait_time: 1.5, timeout_s: 0.5, phases: [peak]}
    short_qa_interactive: {fixed_count: 2, attributes: {wait_time: 1.5, timeout_s: 0.5}}
load:
  shape: peak_trough
  duration_s: 100
  shape_attributes:
    peak_users: 4
    trough_users: 4
    peak_s: 10
    trough_s: 20
    cycles: 2
    spawn_rate: 1000
    batch_traffic_classes: []
    start_with_peak: true
"""


def _plan(tmp_path: Path, text: str = PLAN, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _needs(plan: Plan, gates: Path | None = None) -> dict[str, tuple[float | None, Reach]]:
    result = sample_plan(plan, load_gate_file(gates))
    return {g.gate: (g.expected.n, g.reach) for g in result.gates}


def test_requests_are_counted_from_users_wait_times_and_bursts(tmp_path: Path) -> None:
    plan = load_plan(_plan(tmp_path))
    needs = _needs(plan)
    assert needs["availability"][0] == pytest.approx(120, rel=1e-3)  # cancels left out
    assert needs["ttft_critical_p95"][0] == pytest.approx(120, rel=1e-3)
    assert needs["cancel_release_p99"][0] == pytest.approx(300, rel=1e-3)
    assert needs["ttft_critical_p95"][1] is Reach.ENOUGH  # 72 needed
    assert needs["availability"][1] is Reach.SHORT  # 381 needed
    assert needs["cancel_release_p99"][1] is Reach.SHORT  # 368 needed
    assert needs["failover_no_double_reservation"] == (1, Reach.SHORT)  # one kill, 2 needed


def test_a_class_restricted_to_peaks_sends_only_there(tmp_path: Path) -> None:
    needs = _needs(load_plan(_plan(tmp_path, PHASED)))
    assert needs["ttft_critical_p95"][0] == pytest.approx(20, rel=1e-3)  # 2 users x 20 s
    assert needs["availability"][0] == pytest.approx(80, rel=1e-3)  # and 2 x 60 s
    assert needs["batch_stops_at_peak"] == (4, Reach.ENOUGH)  # two peaks, two troughs


def test_users_are_spread_over_classes_as_locust_spreads_them() -> None:
    """The CI plan: 124 users, 94 of them fixed, 30 by weights that add up to 30."""
    plan = load_plan(ROOT / "harness/plans/ci.yaml")
    counts = distribute(build_user_classes(plan, "http://127.0.0.1"), 124)
    for name, spec in plan.traffic.classes.items():
        assert counts[name] == (spec.fixed_count or spec.weight), name


def test_a_longer_load_is_enough(tmp_path: Path) -> None:
    code = plan_main(["check", str(_plan(tmp_path)), "--set", "load.duration_s=200"])
    assert code == EXIT_OK


def test_plan_check_prints_the_table_and_exits_4_when_a_key_gate_falls_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert plan_main(["check", str(_plan(tmp_path))]) == EXIT_SHORT
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    # 381 at 2 a second take 190.5 s: 130.5 s more than the 60 s of load
    cells = rows["availability"].split()
    assert cells[:4] == ["availability", "rate", ">=", "0.99"]
    assert cells[4:] == ["381", "120", "(a)", "191", "s", "short", "by", "131", "s"]
    assert "enough" in rows["ttft_critical_p95"]
    assert "(a) assumed latencies, the reference server at time_scale 1" in out
    assert out.rstrip().splitlines()[-1].startswith("SHORT: 2 key gate(s)")


def test_plan_check_exits_5_when_a_key_gate_cannot_be_estimated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gates = tmp_path / "refusals.gates.yaml"
    gates.write_text(
        "version: 1\ngates:\n  - {id: refused, title: refusals, metric: explicit_refusal,"
        ' pass: "rate >= 0.99", key: true, blocks: "a refusal must say so"}\n'
    )
    assert plan_main(["check", str(_plan(tmp_path)), "--gates", str(gates)]) == EXIT_UNKNOWN
    assert "UNKNOWN: no estimate for key gate(s) refused" in capsys.readouterr().out


def test_plan_check_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_main(["check", str(_plan(tmp_path)), "--json"]) == EXIT_SHORT
    data = json.loads(capsys.readouterr().out)
    gates = {g["id"]: g for g in data["gates"]}
    assert data["exit_code"] == EXIT_SHORT
    assert gates["availability"]["needed"] == 381 and gates["availability"]["reach"] == "short"
    assert gates["availability"]["time_needed_s"] == pytest.approx(190.5, abs=0.1)
    assert gates["availability"]["source"] == "assumed"
    assert data["load_needed_s"] == pytest.approx(190.5, abs=0.1)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["{tmp}/absent.yaml"], "no such plan file"),
        (["{plan}", "--from", "{tmp}/absent"], "--from {tmp}/absent: run directory"),
        (["{plan}", "--gates", "{tmp}/absent.yaml"], "cannot be read"),
    ],
)
def test_plan_check_refuses_bad_input_with_exit_2(
    tmp_path: Path, args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan(tmp_path)
    code = plan_main(["check", *(a.format(tmp=tmp_path, plan=plan) for a in args)])
    assert code == 2
    assert expected.format(tmp=tmp_path) in capsys.readouterr().err


def _run_dir(tmp_path: Path, plan_of_run: Plan | None) -> Path:
    """45 critical questions over the builder's 90 s of load."""
    b = RunBuilder()
    for i in range(45):
        b.request(f"c{i}", t=10 + 2 * i, priority="critical", **FINISHED)
    path = b.write(tmp_path / "run")
    if plan_of_run is not None:
        data = json.loads(plan_of_run.model_dump_json()) | {"base_dir": plan_of_run.base_dir}
        (path / "plan.json").write_text(json.dumps(data))
    return path


def test_from_a_run_its_measured_rate_replaces_the_model(tmp_path: Path) -> None:
    """Without the run's plan, its 45 questions in 90 s are 30 in this plan's 60 s."""
    plan = load_plan(_plan(tmp_path))
    gates = load_gate_file()
    result = sample_plan(plan, gates, measure(_run_dir(tmp_path, None), gates))
    ttft = next(g for g in result.gates if g.gate == "ttft_critical_p95")
    assert ttft.expected.source is Source.MEASURED
    assert ttft.expected.n == pytest.approx(30, rel=1e-3)
    assert ttft.reach is Reach.SHORT


def test_from_a_run_of_another_plan_its_counts_follow_the_traffic(tmp_path: Path) -> None:
    """The run had 2 critical users for 90 s (90 questions by the model, 45 measured); this
    plan has 4 for 60 s (120 by the model): 45 x 120 / 90 = 60."""
    plan = load_plan(_plan(tmp_path))
    smaller = PLAN.replace("fixed_count: 4", "fixed_count: 2").replace("users: 6", "users: 4")
    other = load_plan(
        _plan(tmp_path, smaller.replace("duration_s: 60", "duration_s: 90"), "o.yaml")
    )
    gates = load_gate_file()
    result = sample_plan(plan, gates, measure(_run_dir(tmp_path, other), gates))
    ttft = next(g for g in result.gates if g.gate == "ttft_critical_p95")
    assert ttft.expected.n == pytest.approx(60, rel=1e-2)
    assert "x1.33 for this plan's traffic" in ttft.expected.basis


def test_run_strict_refuses_a_load_too_short_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = run_main([str(_plan(tmp_path)), "--strict", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "--strict: the load is too short" in captured.err
    assert "availability        needs 381, expects 120: short by 131 s" in captured.err
    assert not out.exists()  # no run directory, so nothing was started


def test_without_strict_the_sample_plan_warns(tmp_path: Path) -> None:
    plan = load_plan(_plan(tmp_path))
    classes = build_user_classes(plan, "http://127.0.0.1")
    said: list[str] = []
    announce(plan, load_gate_file(), classes, strict=False, say=said.append)
    assert said[-1] == "kvgate: warning: running it anyway (--strict refuses such a load)"
    with pytest.raises(LoadTooShort):
        announce(plan, load_gate_file(), classes, strict=True, say=said.append)


def test_kvgate_plan_check_is_a_command(tmp_path: Path) -> None:
    done = kvgate("plan", "check", _plan(tmp_path), "--set", "load.duration_s=200")
    assert done.returncode == 0, done.stderr
    assert "ENOUGH: every key gate" in done.stdout


def test_the_model_keeps_what_the_plan_fixes(tmp_path: Path) -> None:
    """Faults that kill, and when the first fault fires, come from the plan itself."""
    traffic = model(load_plan(_plan(tmp_path)))
    assert traffic.kills == 1 and traffic.first_fault_s == 10
    assert traffic.load_s == pytest.approx(60, abs=0.01)


def test_a_probe_task_counts_its_escalations_and_groups(tmp_path: Path) -> None:
    """Each task: 2 escalations one after another, then 2 groups at once (warm, probe,
    control in turn), every request capped at 0.25 s: 1.25 s, and 1 s of wait."""
    text = PLAN.replace(
        PLAN[PLAN.index("    short_qa_critical") : PLAN.index("load:")],
        "    security_probe:\n      fixed_count: 1\n"
        "      attributes: {groups_at_once: 2, wait_time: 1.0, timeout_s: 0.25}\n",
    ).replace("users: 6", "users: 1")
    needs = _needs(load_plan(_plan(tmp_path, text)))
    assert needs["priority_escalation"][0] == pytest.approx(60 / 2.25 * 2, rel=1e-3)
    assert needs["private_prefix_isolation"][0] == pytest.approx(60 / 2.25 * 2, rel=1e-3)
    assert needs["availability"] == (0, Reach.SHORT)  # probes are not availability's


def test_a_vllm_kvgate_starts_gives_the_recorders_events() -> None:
    """The vLLM profile promises no per-request events; kvgate's recorder in the vLLM it
    starts gives them, so the gates that read them apply (tenant shares stay N/A)."""
    needs = _needs(load_plan(ROOT / "harness/plans/vllm.yaml"))
    assert needs["cancel_release_p99"][1] is not Reach.NA
    assert needs["tenant_share_cap"][1] is Reach.NA
    off = load_plan(ROOT / "harness/plans/vllm.yaml", ["target.record_events=false"])
    assert _needs(off)["cancel_release_p99"][1] is Reach.NA


def test_without_locusts_dispatch_order_the_split_is_proportional() -> None:
    from harness.sampleplan import traffic

    names = list(traffic._proportional([("a", 3), ("b", 1)], 6))
    assert names[-1] is None and sorted(n for n in names if n) == ["a"] * 5 + ["b"]


def test_a_load_that_runs_until_decided_plans_for_the_anytime_bound_within_its_maximum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Such a load waits for each gate's anytime-valid bound, which needs more than the
    verdict's fixed-n interval (607 against 381 for `rate >= 0.99`); its length is its
    maximum, so a key gate that cannot reach its need by then is short."""
    until = ["--set", "load.until=decided", "--set", "load.min_duration_s=20"]
    path = str(_plan(tmp_path))
    assert plan_main(["check", path, *until, "--set", "load.max_duration_s=600", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["until_decided"] and result["load_s"] == 600
    needs = {g["id"]: g["needed"] for g in result["gates"]}
    assert needs["availability"] == 607 and needs["ttft_critical_p95"] == 177
    assert needs["no_oom"] == 1  # a count: its min_samples, as at fixed n
    assert plan_main(["check", path, *until, "--set", "load.max_duration_s=250"]) == EXIT_SHORT
    out = capsys.readouterr().out
    assert "up to 250 s of load" in out and "anytime-valid bound" in out
    # 607 at 2 a second take 303.5 s: availability falls short of a 250 s maximum
    assert "load.max_duration_s" in out.rstrip().splitlines()[-1]
