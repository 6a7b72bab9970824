"""The run's verdict: a key gate that has clearly failed makes the run FAIL, whatever else
lacks evidence; INVALID is for runs whose evidence cannot be trusted (gates/evaluator.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gates.evaluator import evaluate
from gates.rundir import load_run
from gates.spec import load_gate_file
from gates.verdict import Status, Verdict
from tests.gates.builder import RunBuilder, batch_waiting, cpu_warning, critical, gate_file
from tests.gates.conftest import gate

Judge = Callable[[RunBuilder], Verdict]


def slow_critical(b: RunBuilder, n: int, ttft: float) -> RunBuilder:
    for i in range(n):
        b.request(f"c{i}", t=20 + i * 0.05, ttft_s=ttft, priority="critical")
    return b


def test_a_clear_latency_failure_fails_the_run_although_availability_lacks_evidence(
    judge: Judge,
) -> None:
    """200 critical requests, every first token at 12 s: the p95's whole interval is past
    900 ms, and 200 answered requests cannot prove 99% availability (381 needed). More
    requests would not rescue the run, so it is FAIL, not INVALID."""
    verdict = judge(slow_critical(RunBuilder(), 200, ttft=12.0))
    ttft, availability = gate(verdict, "ttft_critical_p95"), gate(verdict, "availability")
    assert ttft.status == Status.FAIL and not ttft.straddles
    assert availability.status == Status.INVALID and availability.needs_n == 381
    assert verdict.status == Status.FAIL and verdict.exit_code == 3


def test_a_latency_failure_that_straddles_the_line_waits_for_evidence(judge: Judge) -> None:
    """80 critical requests, 5 of them (6%) slow: the p95 breaks the line, but its interval
    still reaches below it. With availability unproven, the run is INVALID."""
    b = slow_critical(RunBuilder(), 75, ttft=0.2)
    for i in range(75, 80):
        b.request(f"c{i}", t=20 + i * 0.05, ttft_s=2.0, priority="critical")
    verdict = judge(b)
    ttft = gate(verdict, "ttft_critical_p95")
    assert ttft.status == Status.FAIL and ttft.straddles
    assert verdict.status == Status.INVALID


def test_a_clear_latency_failure_on_a_starved_load_generator_is_invalid(judge: Judge) -> None:
    """Timings from a load generator over its CPU budget prove nothing, however slow."""
    b = slow_critical(RunBuilder(), 200, ttft=12.0)
    verdict = judge(cpu_warning(b))
    assert gate(verdict, "ttft_critical_p95").status == Status.FAIL
    assert verdict.status == Status.INVALID
    assert any("CPU warning" in p for p in verdict.run_problems)


def test_a_leak_fails_the_run_even_on_a_starved_load_generator(judge: Judge) -> None:
    """A release that never came is +inf: a busy machine makes releases late, it does not
    make them vanish, so the leak fails the run whatever the CPU said."""
    b = RunBuilder()
    for i in range(400):
        rid = f"x{i}"
        b.request(rid, t=20 + i * 0.1, cancel_at=20 + i * 0.1 + 0.5, outcome="cancelled")
        b.event("admitted", 20 + i * 0.1, request_id=rid)
        if i % 20:  # one cancellation in 20 is never released
            b.event("released", 20 + i * 0.1 + 0.51, request_id=rid)
    verdict = judge(cpu_warning(b))
    release = gate(verdict, "cancel_release_p99")
    assert release.status == Status.FAIL and release.value == float("inf")
    assert verdict.status == Status.FAIL


def test_a_rollback_that_did_not_finish_makes_the_run_invalid(judge: Judge) -> None:
    """The server may have been left down: the rest of the run says nothing about it."""
    b = RunBuilder()
    for i in range(400):
        b.request(f"q{i}", t=20 + i * 0.1, ttft_s=0.2, priority="critical")
    b.fault(30.0, target="vllm")
    b.rows["faults"][-1]["outcome"] = "failed: rollback interrupted"
    verdict = judge(b)
    assert verdict.status == Status.INVALID
    [problem] = [p for p in verdict.run_problems if "rollback" in p]
    assert "vllm" in problem and "left down" in problem


def test_a_lagging_simulator_excuses_a_breach_only_as_far_as_it_lagged(judge: Judge) -> None:
    """The simulator's steps were at most 0.4 s late: a release p99 of 3 s against a 2 s
    line is no artefact of that, and fails the run; one of 2.2 s could be, and the run is
    INVALID."""

    def releases(delay_s: float) -> RunBuilder:
        b = RunBuilder()
        for i in range(400):
            rid = f"x{i}"
            b.request(rid, t=20 + i * 0.1, cancel_at=20 + i * 0.1 + 0.5, outcome="cancelled")
            b.event("admitted", 20 + i * 0.1, request_id=rid)
            b.event("released", 20 + i * 0.1 + 0.5 + delay_s, request_id=rid)
        b.meta.update(sim_lag_ms_p99=300.0, sim_lag_ms_max=400.0, sim_lag_bound_ms=100.0)
        return b

    late = judge(releases(3.0))
    assert gate(late, "cancel_release_p99").status == Status.FAIL
    assert late.status == Status.FAIL and any("lagged" in p for p in late.run_problems)
    close = judge(releases(2.2))
    assert gate(close, "cancel_release_p99").status == Status.FAIL
    assert close.status == Status.INVALID


PRIORITY_GATE = """
  - id: priority_under_pressure
    title: While lower-priority work waits, P95 TTFT of critical questions stays at most 900 ms
    metric: ttft_under_pressure
    filter: {priority: [critical], traffic_class: [short_qa]}
    pass: "p(95) <= 900ms"
    blocks: critical questions waited behind lower-priority work
"""


def test_ttft_under_pressure_is_a_timing_and_a_starved_load_generator_cannot_prove_it(
    tmp_path: Path,
) -> None:
    """Critical questions answered in 4 s while batch work waited: on trusted timings the
    whole interval is past 900 ms and the run FAILs. The same run on a load generator over
    its CPU budget is INVALID, because the metric declares itself a timing: the 4 s may be
    the load generator's own lateness."""
    b = critical(batch_waiting(RunBuilder(), 20.0, 60.0), 21.0, 100, ttft=4.0)
    gates = load_gate_file(gate_file(tmp_path / "priority.yaml", PRIORITY_GATE))
    trusted = evaluate(load_run(b.write(tmp_path / "trusted")), gates)
    result = gate(trusted, "priority_under_pressure")
    assert result.timing and result.value == 4.0 and not result.straddles
    assert trusted.status == Status.FAIL
    starved = evaluate(load_run(cpu_warning(b).write(tmp_path / "starved")), gates)
    assert gate(starved, "priority_under_pressure").status == Status.FAIL
    assert starved.status == Status.INVALID
