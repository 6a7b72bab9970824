"""The running evaluation: a gate with abort_on_fail stops the load, the verdict says so; the
key gates of a load that runs until decided stop it once settled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import pytest

from gates.evaluator import evaluate_run
from gates.spec import GateSpec, load_gate_file
from gates.verdict import Status
from harness.live.until import UntilDecided
from harness.live.watch import BACKGROUND_NICE, RunWatch, clearly_failed
from harness.live.watch import main as watch_main
from tests.gates.builder import RunBuilder
from tests.waiting import wait_until

ABORTING = (
    "extends: builtin\n"
    "gates:\n"
    "  - {id: no_oom, abort_on_fail: true}\n"
    "  - {id: tenant_share_cap, abort_on_fail: true, abort_grace_s: 1000}\n"
)


def oom_run(tmp_path: Path) -> tuple[Path, Path]:
    b = RunBuilder()
    b.meta["status"] = "running"
    for i in range(50):
        b.request(f"r{i}", ttft_s=0.1)
    b.event("oom", 30, reason="torch.OutOfMemoryError: CUDA out of memory")
    gates = tmp_path / "gates.yaml"
    gates.write_text(ABORTING)
    return b.write(tmp_path / "run"), gates


def test_a_failed_abort_gate_stops_the_load_with_its_reason(tmp_path: Path) -> None:
    run, gates = oom_run(tmp_path)
    written = []
    watch = RunWatch(run, gates, None, lambda: written.append(1))
    try:
        assert set(watch.abort_gates) == {"no_oom", "tenant_share_cap"} and watch.needed
        assert watch.tick(5.0) is None and not written  # the first check comes at 10 s
        # The check runs in a child process; each tick asks whether it has answered.
        reason = wait_until(lambda: watch.tick(12.0), timeout_s=60, what="the abort gate's verdict")
    finally:
        watch.close()
    assert reason.startswith("aborted at +12 s by gate no_oom")
    assert written and watch.aborted is not None and watch.aborted["gate"] == "no_oom"


def test_a_look_runs_at_the_lowest_cpu_priority(tmp_path: Path) -> None:
    """A look must not take CPU from the server or the client whose timings it judges."""
    run, gates = oom_run(tmp_path)
    watch = RunWatch(run, gates, None, lambda: None)
    try:
        watch.tick(12.0)
        assert watch._check is not None
        # Not yet polled, so not yet reaped: an ended child still shows its niceness.
        assert psutil.Process(watch._check.pid).nice() == BACKGROUND_NICE == 19
    finally:
        watch.close()


def test_the_aborted_run_fails_and_its_reports_say_why(tmp_path: Path) -> None:
    b = RunBuilder()
    for i in range(400):
        b.request(f"r{i}", t=20 + i * 0.05, ttft_s=0.1, priority="critical")
    b.meta["aborted"] = {"gate": "tenant_share_cap", "at_s": 42.0, "message": "max = 0.31"}
    verdict = evaluate_run(b.write(tmp_path / "run"))
    assert verdict.status == Status.FAIL and verdict.exit_code == 3
    assert verdict.notes[0].startswith("aborted at +42 s by gate tenant_share_cap")


def test_without_abort_gates_or_interim_reports_nothing_runs(tmp_path: Path) -> None:
    watch = RunWatch(tmp_path, None, None, lambda: None)
    assert not watch.needed and watch.tick(100.0) is None


def test_only_a_clear_failure_aborts() -> None:
    """Only a FAIL decided by the gate's anytime-valid bound, on at least its minimum samples,
    stops the load. A breach that only today's fixed-n interval calls clear may turn with
    more evidence (looked at every 10 s, such an interval crosses its line by chance): the
    soak goes on and the verdict judges it at the end."""
    gate = GateSpec.model_validate(
        {"id": "floor", "title": "t", "metric": "memory_floor", "pass": "slope <= 0.02",
         "min_samples": 5, "abort_on_fail": True}
    )  # fmt: skip
    clear = {"status": "FAIL", "decision": "FAIL", "n_samples": 6}
    assert clearly_failed(clear, gate)
    assert not clearly_failed({**clear, "decision": "UNDECIDED"}, gate)
    assert not clearly_failed({**clear, "n_samples": 4}, gate)
    assert not clearly_failed({**clear, "status": "MARGINAL"}, gate)
    # an older check's output, with no anytime decision: not proof
    assert not clearly_failed({"status": "FAIL", "straddles": False, "n_samples": 6}, gate)


def availability_run(tmp_path: Path, errors: int, n: int = 300) -> tuple[Path, Path]:
    b = RunBuilder()
    b.meta["status"] = "running"
    for i in range(n):
        failed = {"outcome": "error", "http_status": 500} if i < errors else {}
        b.request(f"r{i}", t=20 + i * 0.1, ttft_s=0.1, **failed)
    gates = tmp_path / "gates.yaml"
    gates.write_text("extends: builtin\ngates:\n  - {id: availability, abort_on_fail: true}\n")
    return b.write(tmp_path / f"run{errors}"), gates


def checked(run: Path, gates: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert watch_main(["check", str(run), str(gates)]) == 0
    results: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return next(r for r in results if r["id"] == "availability")


def test_a_breach_clear_only_at_fixed_n_does_not_abort(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """291 of 300 served: Wilson's [0.944, 0.984] lies under `rate >= 0.99`, but the anytime
    bound still reaches 0.99: a check every 10 s must not stop the load on it."""
    run, gates = availability_run(tmp_path, errors=9)
    gate = GateSpec.model_validate(
        {"id": "availability", "title": "t", "metric": "availability", "pass": "rate >= 0.99",
         "abort_on_fail": True}
    )  # fmt: skip
    result = checked(run, gates, capsys)
    assert result["status"] == "FAIL" and not result["straddles"]  # today's rule would abort
    assert result["decision"] == "UNDECIDED" and not clearly_failed(result, gate)
    assert result["bound_text"].startswith("[0.93") and "mixture" in result["bound_text"]
    run, gates = availability_run(tmp_path, errors=60)  # 80% served: decided
    result = checked(run, gates, capsys)
    assert result["decision"] == "FAIL" and clearly_failed(result, gate)


KEYED = (
    "version: 1\n"
    "gates:\n"
    "  - {id: served, title: s, metric: availability, pass: 'rate >= 0.9', key: true,\n"
    "     blocks: an outage}\n"
    "  - {id: no_oom, title: o, metric: oom_events, pass: 'count == 0', key: true,\n"
    "     blocks: an OOM}\n"
    "  - {id: quick, title: q, metric: ttft, pass: 'p(50) <= 1ms'}\n"
    "  - {id: fast, title: f, metric: ttft, pass: 'p(50) <= 1s', blocks: slow answers}\n"
)


def served_run(tmp_path: Path, n: int) -> tuple[Path, Path]:
    b = RunBuilder()
    b.meta["status"] = "running"
    for i in range(n):
        b.request(f"r{i}", t=20 + i * 0.05, ttft_s=0.1)
    gates = tmp_path / "gates.yaml"
    gates.write_text(KEYED)
    return b.write(tmp_path / f"run{n}"), gates


def test_the_key_check_judges_key_gates_with_their_way_to_a_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--blocking` (a load that runs until decided) judges the key gates and the other
    gates that block, none of which aborts: each with its anytime decision, n, about how
    many a decision needs, and whether it is settled. 50 of 50 served does not yet decide
    `rate >= 0.9`; a count is settled by what the run observed."""
    run, gates = served_run(tmp_path, 50)
    assert watch_main(["check", str(run), str(gates), "--blocking"]) == 0
    results = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(results) == {"served", "no_oom", "fast"}  # `quick` neither is key nor blocks
    assert not results["fast"]["key"] and results["fast"]["n"] == 50
    served, no_oom = results["served"], results["no_oom"]
    assert served["key"] and served["decision"] == "UNDECIDED" and not served["settled"]
    assert served["n"] == 50 and 50 < served["needs_n"] < 200
    assert no_oom["decision"] == "UNDECIDED" and no_oom["settled"]
    assert no_oom["settled_by"] == "observed"
    assert watch_main(["check", str(run), str(gates)]) == 0
    assert json.loads(capsys.readouterr().out) == []  # no abort gate, no --blocking: nothing


def test_a_load_that_runs_until_decided_stops_on_the_check_that_settles_its_key_gates(
    tmp_path: Path,
) -> None:
    run, gates = served_run(tmp_path, 300)
    until = UntilDecided(load_gate_file(gates).gates, min_s=5.0, max_s=60.0)
    watch = RunWatch(run, gates, None, lambda: None, until=until)
    try:
        assert watch.needed and watch.tick(5.0) is None  # the first check comes at 10 s
        reason = wait_until(lambda: watch.tick(12.0), timeout_s=60, what="the key gates' check")
    finally:
        watch.close()
    assert reason == "every key and blocking gate decided at +12 s (load.until: decided)"
    assert [g["decision"] for g in until.progress()] == ["PASS", "UNDECIDED", "PASS"]
    assert watch.aborted is None
