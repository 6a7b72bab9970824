"""`kvgate qualify`: the detection matrix, false alarms and exit code over faked runs, and its
refusals of bad input before anything starts."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import contract
from gates.stats import wilson
from harness.qualify import cli as qualify_cmd
from harness.qualify.findings import qualify
from tests.cli_helpers import kvgate

PLAN = """
name: q
target: {type: reference, replicas: 1}
traffic:
  classes:
    short_qa_critical: {weight: 1}
load: {users: 1, duration_s: 1}
"""
EXIT = {"PASS": 0, "FAIL": 3, "MARGINAL": 4, "INVALID": 5}
# The value each gate reports in a run where it has this status (threshold "value <= 1").
VALUES = {"PASS": 0.5, "MARGINAL": 0.95, "FAIL": 2.0, "INVALID": 0.9}


def gate(status: str, value: float | None = None) -> dict[str, Any]:
    return {
        "status": status,
        "value": VALUES[status] if value is None else value,
        "interval": None,
        "n": 400,
        "censored": 0,
        "threshold": "max <= 1",
        "key": True,
    }


def record(
    run_dir: Path | str,
    statuses: dict[str, str],
    values: dict[str, float] | None = None,
    verdict: str | None = None,
    evidence_problems: Sequence[str] = (),
) -> dict[str, Any]:
    """A record shaped like `runs.run_once`'s; the verdict is the worst gate status unless
    given (a run whose evidence was distrusted reads INVALID whatever its gates said)."""
    worst = next((s for s in ("FAIL", "INVALID", "MARGINAL") if s in statuses.values()), "PASS")
    status = verdict or worst
    return {
        "run_dir": str(run_dir),
        "exit_code": EXIT[status],
        "wall_s": 12.5,
        "status": status,
        "problems": list(evidence_problems),
        "evidence_problems": list(evidence_problems),
        "sim_lag_ms_p99": 3.0,
        "cpu_warning": False,
        "gates": {g: gate(s, (values or {}).get(g)) for g, s in statuses.items()},
    }


def error_record(run_dir: Path | str, exit_code: int = 1) -> dict[str, Any]:
    return {
        "run_dir": str(run_dir),
        "exit_code": exit_code,
        "wall_s": 1.0,
        "status": "ERROR",
        "gates": {},
        "problems": ["Traceback: boom"],
    }


ALL_PASS = {"no_oom": "PASS", "cancel_release_p99": "PASS", "tenant_share_cap": "PASS"}


def caught_by(*failing: str) -> dict[str, str]:
    return {g: ("FAIL" if g in failing else "PASS") for g in ALL_PASS}


def test_mutants_are_detected_by_accident_or_missed() -> None:
    mutants = {
        "slow_release": record("m1", caught_by("cancel_release_p99")),
        # leak_on_cancel expects cancel_release_p99 or memory_back_to_idle: neither failed
        "leak_on_cancel": record("m2", caught_by("no_oom")),
        "no_tenant_cap": record("m3", ALL_PASS),
    }
    q = qualify([record("p1", ALL_PASS), record("p2", ALL_PASS)], mutants, contract.MUTANTS)
    m = q["mutants"]
    assert m["slow_release"]["outcome"] == "detected" and m["slow_release"]["detected"]
    assert m["slow_release"]["expected_gate"] == "cancel_release_p99"
    assert m["slow_release"]["failed_gates"] == ["cancel_release_p99"]
    assert m["leak_on_cancel"]["outcome"] == "by_accident" and not m["leak_on_cancel"]["detected"]
    assert m["leak_on_cancel"]["expected_gates"] == ["cancel_release_p99", "memory_back_to_idle"]
    # the run's gate file has no memory_back_to_idle: that gate could never have caught it
    assert m["leak_on_cancel"]["missing_gates"] == ["memory_back_to_idle"]
    assert m["no_tenant_cap"]["outcome"] == "missed" and m["no_tenant_cap"]["failed_gates"] == []
    assert m["no_tenant_cap"]["statuses"] == ALL_PASS  # the matrix row: every gate's status
    assert q["gate_ids"] == list(ALL_PASS)
    assert q["gates"]["cancel_release_p99"]["caught"] == ["slow_release"]
    assert q["gates"]["cancel_release_p99"]["expected_for"] == ["slow_release", "leak_on_cancel"]
    assert q["gates"]["no_oom"]["caught"] == ["leak_on_cancel"]
    # a miss outranks everything else
    assert q["exit_code"] == 3 and q["result"] == "FAIL"
    assert any("no_tenant_cap was missed" in r for r in q["reasons"])
    assert any("leak_on_cancel was caught only by accident, by no_oom" in r for r in q["reasons"])


def test_false_alarm_rates_carry_wilson_intervals() -> None:
    policy = [record(f"p{i}", ALL_PASS) for i in range(8)]
    policy += [record("p8", {**ALL_PASS, "no_oom": "FAIL"})]
    policy += [record("p9", {**ALL_PASS, "tenant_share_cap": "MARGINAL"})]
    q = qualify(
        policy,
        {"slow_release": record("m", caught_by("cancel_release_p99"))},
        {"slow_release": contract.MUTANTS["slow_release"]},
    )
    assert q["runs"] == 10 and q["policy_verdicts"] == {"PASS": 8, "MARGINAL": 1, "FAIL": 1}
    oom = q["gates"]["no_oom"]
    assert oom["false_alarm"]["count"] == 1 and oom["false_alarm"]["rate"] == pytest.approx(0.1)
    assert oom["false_alarm"]["interval"] == pytest.approx(list(wilson(1, 10)))
    assert oom["not_pass"]["count"] == 1
    cap = q["gates"]["tenant_share_cap"]
    assert cap["false_alarm"]["count"] == 0 and cap["false_alarm"]["interval"][0] == 0.0
    assert cap["false_alarm"]["interval"][1] == pytest.approx(wilson(0, 10)[1])
    assert cap["not_pass"]["count"] == 1 and cap["not_pass"]["rate"] == pytest.approx(0.1)
    assert cap["policy_statuses"] == {"PASS": 9, "MARGINAL": 1}
    # a policy FAIL is a false alarm: exit 3 even though every mutant was caught
    assert q["exit_code"] == 3 and "1 of 10 policy runs FAILed" in q["reasons"][0]


def test_margins_in_spreads_flag_gates_that_will_flake() -> None:
    far = [0.5, 0.6, 0.7]  # mean 0.6, spread 0.1: the line at 1 is 4 spreads away
    near = [0.9, 0.97, 1.0]  # mean 0.957, spread 0.051: 0.84 spreads away
    policy = [
        record(f"p{i}", ALL_PASS, {"no_oom": v, "tenant_share_cap": c})
        for i, (v, c) in enumerate(zip(far, near, strict=True))
    ]
    q = qualify(policy, {}, contract.MUTANTS)
    assert q["gates"]["no_oom"]["margin_spreads"] == pytest.approx(4.0)
    assert q["gates"]["no_oom"]["will_flake"] is False
    assert q["gates"]["tenant_share_cap"]["margin_spreads"] == pytest.approx(0.845, abs=0.01)
    assert q["gates"]["tenant_share_cap"]["will_flake"] is True
    assert q["exit_code"] == 0  # every run passed: flaking is a warning, not a failure
    single = qualify([record("p", ALL_PASS)], {}, contract.MUTANTS)["gates"]["no_oom"]
    assert single["margin_spreads"] is None and single["will_flake"] is None  # one run: no spread


@pytest.mark.parametrize(
    ("policy_statuses", "mutant_statuses", "code"),
    [
        (["PASS", "PASS"], caught_by("cancel_release_p99"), 0),
        (["PASS", "MARGINAL"], caught_by("cancel_release_p99"), 4),
        (["PASS", "INVALID"], caught_by("cancel_release_p99"), 4),
        (["PASS", "PASS"], caught_by("no_oom"), 4),  # caught only by accident
        (["PASS", "PASS"], ALL_PASS, 3),  # missed
        (["PASS", "FAIL"], caught_by("cancel_release_p99"), 3),
        (["MARGINAL", "PASS"], ALL_PASS, 3),
    ],
)
def test_exit_codes(policy_statuses: list[str], mutant_statuses: dict[str, str], code: int) -> None:
    policy = [record(f"p{i}", {**ALL_PASS, "no_oom": s}) for i, s in enumerate(policy_statuses)]
    q = qualify(policy, {"slow_release": record("m", mutant_statuses)}, contract.MUTANTS)
    assert q["exit_code"] == code
    assert bool(q["reasons"]) == (code != 0)


@pytest.mark.parametrize("verdict", ["INVALID", "MARGINAL"])
def test_a_gate_that_fails_in_a_run_that_does_not_fail_detects_nothing(verdict: str) -> None:
    """A release manager is stopped by the run's verdict, not by one gate's status."""
    caught = record("m", caught_by("cancel_release_p99"), verdict=verdict)
    q = qualify([record("p", ALL_PASS)], {"slow_release": caught}, contract.MUTANTS)
    m = q["mutants"]["slow_release"]
    assert m["outcome"] == "not_stopped" and m["detected"] is False
    assert m["failed_gates"] == ["cancel_release_p99"] and m["verdict"] == verdict
    assert q["exit_code"] == 4 and q["result"] == "MARGINAL"
    assert q["reasons"] == [
        f"mutant slow_release failed cancel_release_p99, but its run's verdict is {verdict}, "
        "not FAIL: the release would not have been stopped"
    ]
    stopped = record("m", caught_by("cancel_release_p99"), verdict="FAIL")
    q = qualify([record("p", ALL_PASS)], {"slow_release": stopped}, contract.MUTANTS)
    assert q["mutants"]["slow_release"]["detected"] is True and q["exit_code"] == 0


def test_a_run_without_a_verdict_is_neither_caught_nor_missed() -> None:
    q = qualify(
        [record("p", ALL_PASS), error_record("p2")],
        {"slow_release": error_record("runs/mutant-slow_release")},
        contract.MUTANTS,
    )
    assert q["mutants"]["slow_release"]["outcome"] == "no_verdict"
    assert q["mutants"]["slow_release"]["verdict"] == "ERROR"
    assert q["exit_code"] == 4
    assert any("mutant-slow_release.log" in r for r in q["reasons"])
    assert any("1 of 2 policy runs did not PASS (ERROR 1)" in r for r in q["reasons"])
    # the gate was judged in one policy run only: its rates are over that one
    assert q["gates"]["no_oom"]["false_alarm"]["n"] == 1


def _plan(tmp_path: Path, text: str = PLAN) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def _fake_runs(
    monkeypatch: pytest.MonkeyPatch, outcome: Callable[[Sequence[str]], dict[str, str]]
) -> list[tuple[str, ...]]:
    """Replace `kvgate run` with a record from `outcome(overrides)`; returns the calls."""
    calls: list[tuple[str, ...]] = []

    def run_once(plan: str, overrides: Sequence[str], run_dir: Path) -> dict[str, Any]:
        calls.append(tuple(overrides))
        run_dir.mkdir()
        return record(run_dir, outcome(overrides))

    monkeypatch.setattr(qualify_cmd, "run_once", run_once)
    return calls


def _mutant_of(overrides: Sequence[str]) -> str | None:
    found = [o.split("=", 1)[1] for o in overrides if o.startswith("target.mutant=")]
    return found[0] if found else None


def test_qualify_runs_policy_then_mutants_and_writes_the_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def outcome(overrides: Sequence[str]) -> dict[str, str]:
        mutant = _mutant_of(overrides)
        if mutant is None:
            return ALL_PASS
        return caught_by(*contract.MUTANTS[mutant].gates)

    calls = _fake_runs(monkeypatch, outcome)
    out = tmp_path / "q"
    args = [str(_plan(tmp_path)), "--runs", "3", "--mutants", "slow_release,no_tenant_cap"]
    code = qualify_cmd.main([*args, "--out", str(out), "--set", "seed=4", "--json"])
    assert code == 0
    assert calls == [
        ("seed=4",),
        ("seed=4",),
        ("seed=4",),
        ("seed=4", "target.mutant=slow_release"),
        ("seed=4", "target.mutant=no_tenant_cap"),
    ]
    stdout = capsys.readouterr().out.splitlines()
    assert re.match(
        r"kvgate qualify: 5 runs of .*plan\.yaml: 3 of the policy under test", stdout[0]
    )
    assert stdout[1] == "run 1/5 policy 1/3: PASS (exit 0, 12.5 s)"
    assert stdout[4] == (
        "run 4/5 mutant slow_release: FAIL (exit 3, 12.5 s): caught by cancel_release_p99"
    )
    printed = json.loads(stdout[-1])
    written = json.loads((out / "qualify.json").read_text())
    assert printed == written
    assert written["runs"] == 3 and written["policy_verdicts"] == {"PASS": 3}
    assert written["overrides"] == ["seed=4"]
    assert written["mutants"]["no_tenant_cap"]["detected"] is True
    assert written["mutants"]["no_tenant_cap"]["expected_gate"] == "tenant_share_cap"
    assert written["gates"]["no_oom"]["false_alarm"]["count"] == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "mutant-no_tenant_cap",
        "mutant-slow_release",
        "policy-01",
        "policy-02",
        "policy-03",
    ]
    md = (out / "qualify.md").read_text()
    assert md.startswith("# Qualification of ") and ": PASS (exit 0)" in md.splitlines()[0]
    assert "| no_tenant_cap | detected | FAIL | PASS | PASS | **FAIL** |" in md
    assert "| no_oom | yes | 0/3 = 0% [0%, 56%] |" in md
    html = (out / "qualify.html").read_text()
    assert 'id="result"' in html and ">PASS<" in html
    assert '<td class="cell expected" data-gate="tenant_share_cap" data-status="FAIL"' in html
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.search(r"(https?:)?//[a-z]", html)


def test_qualify_exit_code_and_report_show_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_runs(monkeypatch, lambda overrides: ALL_PASS)
    out = tmp_path / "q"
    plan = str(_plan(tmp_path))
    code = qualify_cmd.main([plan, "--runs", "1", "--mutants", "no_tenant_cap", "--out", str(out)])
    assert code == 3
    captured = capsys.readouterr().out
    assert "run 2/2 mutant no_tenant_cap: PASS (exit 0, 12.5 s): MISSED" in captured
    assert "kvgate qualify: FAIL (exit 3)" in captured
    html = (out / "qualify.html").read_text()
    assert 'data-mutant="no_tenant_cap" data-outcome="missed"' in html
    assert "mutant no_tenant_cap was missed" in html


def test_a_run_that_refuses_its_input_stops_the_qualification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Path] = []

    def run_once(plan: str, overrides: Sequence[str], run_dir: Path) -> dict[str, Any]:
        calls.append(run_dir)
        return error_record(run_dir, exit_code=2)

    monkeypatch.setattr(qualify_cmd, "run_once", run_once)
    code = qualify_cmd.main([str(_plan(tmp_path)), "--runs", "3", "--out", str(tmp_path / "q")])
    assert code == 2 and len(calls) == 1
    assert "kvgate run refused its input" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["{tmp}/absent.yaml"], "no such plan file"),
        (["{plan}", "--set", "faults=["], "the value is not valid YAML"),
        (["{plan}", "--set", "target.tenants=absent.yaml"], "target.tenants: "),
        (["{plan}", "--set", "gates=absent.yaml"], "gates: "),
        (["{plan}", "--runs", "0"], "--runs 0: give at least 1 run"),
        (["{plan}", "--mutants", "slow_release,bogus"], "unknown bogus; give all, or some of: "),
        (["{plan}", "--mutants", ","], "empty"),
        (["{plan}", "--set", "target.mutant=slow_release"], "carries mutant 'slow_release'"),
        (
            ["{plan}", "--set", "target={{type: external, url: 'http://127.0.0.1:9'}}"],
            "the plan declares no misconfigurations",
        ),
        (["{plan}", "--out", "{plan}/q"], "--out {plan}/q: cannot write there"),
        (["{plan}", "--out", "{tmp}"], "is not empty; choose a new folder"),
    ],
)
def test_bad_input_exits_2_before_anything_runs(
    tmp_path: Path, args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (a traceback would fail the test): each a few seconds less than
    spawning the command; test_kvgate_lists_qualify checks the command itself."""
    plan = _plan(tmp_path)
    if "--out" not in args:
        args = [*args, "--out", "{tmp}/q"]
    code = qualify_cmd.main([a.format(tmp=tmp_path, plan=plan) for a in args])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert expected.format(plan=plan) in err
    assert out == ""  # the plan of work is printed only once the input is sound
    assert not (tmp_path / "q").exists()


def test_unknown_mutant_lists_the_valid_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert qualify_cmd.main([str(_plan(tmp_path)), "--mutants", "bogus"]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in contract.MUTANTS)


def test_kvgate_lists_qualify() -> None:
    done = kvgate("--help")
    assert "qualify PLAN" in done.stdout
    assert kvgate("qualify", "--help").returncode == 0


DISTRUSTED = (
    "clock_offset: client and server clocks disagree by 2.5 s, beyond the 0.5 s bound "
    "[server_events.t, rows 3, 7 (12 in all)]"
)


def test_the_reports_give_every_runs_verdict_and_why_evidence_distrusted_a_mutants_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = iter([ALL_PASS, {**ALL_PASS, "no_oom": "MARGINAL"}])

    def run_once(plan: str, overrides: Sequence[str], run_dir: Path) -> dict[str, Any]:
        run_dir.mkdir()
        mutant = _mutant_of(overrides)
        if mutant is None:
            return record(run_dir, next(policy))
        if mutant == "slow_release":
            return record(run_dir, caught_by("cancel_release_p99"))
        # its gate saw the bug, but the evidence checks distrusted the run: INVALID
        caught = caught_by("tenant_share_cap")
        return record(run_dir, caught, verdict="INVALID", evidence_problems=[DISTRUSTED])

    monkeypatch.setattr(qualify_cmd, "run_once", run_once)
    out = tmp_path / "q"
    args = [str(_plan(tmp_path)), "--runs", "2", "--mutants", "slow_release,no_tenant_cap"]
    assert qualify_cmd.main([*args, "--out", str(out)]) == 4

    written = json.loads((out / "qualify.json").read_text())
    assert [r["status"] for r in written["policy_runs"]] == ["PASS", "MARGINAL"]
    assert written["policy_verdicts"] == {"PASS": 1, "MARGINAL": 1}
    mutants = written["mutants"]
    assert mutants["slow_release"]["verdict"] == "FAIL" and mutants["slow_release"]["detected"]
    distrusted = mutants["no_tenant_cap"]
    assert distrusted["verdict"] == "INVALID" and distrusted["outcome"] == "not_stopped"
    assert distrusted["evidence_problems"] == [DISTRUSTED]

    md = (out / "qualify.md").read_text()
    assert "| slow_release | detected | FAIL |" in md
    assert "| no_tenant_cap | caught, not stopped | INVALID |" in md
    assert (
        f"Mutant runs whose evidence checks made them INVALID:\n\n- no_tenant_cap: {DISTRUSTED}"
        in md
    )
    runs = md[md.index("## Runs") :]
    for name, verdict in [
        ("policy-01", "PASS"),
        ("policy-02", "MARGINAL"),
        ("mutant-slow_release", "FAIL"),
        ("mutant-no_tenant_cap", "INVALID"),
    ]:
        assert f"| {name} | {verdict} | {EXIT[verdict]} |" in runs

    html = (out / "qualify.html").read_text()
    row = html[html.index('data-mutant="no_tenant_cap"') :]
    row = row[: row.index("</tr>")]
    assert f'<ul class="problems evidence-problems"><li>{DISTRUSTED}</li></ul>' in row
    caught_row = html[html.index('data-mutant="slow_release"') :]
    assert "evidence-problems" not in caught_row[: caught_row.index("</tr>")]
    listed = html[html.index('<section id="runs">') :]
    for name, verdict in [
        ("policy-01", "PASS"),
        ("policy-02", "MARGINAL"),
        ("mutant-slow_release", "FAIL"),
        ("mutant-no_tenant_cap", "INVALID"),
    ]:
        assert re.search(rf"{name}</td><td style=\"[^\"]*\">{verdict}</td>", listed), name
