"""The running evaluation: a gate with abort_on_fail stops the load; the verdict says so."""

from __future__ import annotations

from pathlib import Path

from gates.evaluator import evaluate_run
from gates.spec import GateSpec
from gates.verdict import Status
from harness.live.watch import RunWatch, clearly_failed
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
    """A breach the interval straddles, or one on fewer samples than the gate's minimum, may
    turn with more evidence: the soak goes on and the verdict judges it at the end."""
    gate = GateSpec.model_validate(
        {"id": "floor", "title": "t", "metric": "memory_floor", "pass": "slope <= 0.02",
         "min_samples": 5, "abort_on_fail": True}
    )  # fmt: skip
    clear = {"status": "FAIL", "straddles": False, "n_samples": 6}
    assert clearly_failed(clear, gate)
    assert not clearly_failed({**clear, "straddles": True}, gate)
    assert not clearly_failed({**clear, "n_samples": 4}, gate)
    assert not clearly_failed({**clear, "status": "MARGINAL"}, gate)
    assert not clearly_failed({"status": "FAIL"}, gate)  # an older check's output: not proof
