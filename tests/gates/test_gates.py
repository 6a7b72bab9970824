"""The built-in gates over hand-built runs with known answers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gates.evaluator import evaluate
from gates.metrics_release import cancel_release_latency
from gates.metrics_server import batch_peak_trough
from gates.registry import Observations
from gates.rundir import load_run
from gates.spec import GateFilter, load_gate_file
from gates.verdict import Status, Verdict
from tests.gates.builder import FINISHED, T0, RunBuilder, gate_file, preempted
from tests.gates.conftest import gate

Judge = Callable[[RunBuilder], Verdict]


def cancelled_run(latencies: Sequence[float | None]) -> RunBuilder:
    """Cancelled requests that held reservations, one a second from +20 s (the run lasts
    until they are done); None: the server never released it."""
    b = RunBuilder()
    b.meta["t_end"] = max(b.meta["t_end"], T0 + 30 + len(latencies))
    for i, latency in enumerate(latencies):
        rid = f"c{i}"
        b.request(
            rid, t=20 + i, traffic_class="cancel_storm", outcome="cancelled", cancel_at=21.0 + i
        )
        b.event("admitted", 20.1 + i, request_id=rid, tenant="acme", blocks=4)
        if latency is not None:
            b.event("released", 21.0 + i + latency, request_id=rid, tenant="acme", blocks=4)
    return b


def test_zero_cancellations_make_the_release_gate_invalid_not_pass(judge: Judge) -> None:
    b = RunBuilder().request("a", ttft_s=0.1).event("admitted", 20.1, request_id="a")
    verdict = judge(b)
    result = gate(verdict, "cancel_release_p99")
    assert result.status == Status.INVALID
    assert "no cancelled" in result.message
    assert verdict.status == Status.INVALID  # a key gate without data
    assert verdict.exit_code == 5


def spread(n: int, low: float, high: float) -> list[float]:
    return [float(x) for x in np.linspace(low, high, n)]


def test_release_latency_joins_cancel_with_released_event(judge: Judge) -> None:
    latencies = spread(400, 0.05, 0.4)
    verdict = judge(cancelled_run(latencies))
    assert gate(verdict, "cancel_release_p99").status == Status.PASS
    assert gate(verdict, "cancel_release_p99").value == pytest.approx(np.percentile(latencies, 99))
    slow = judge(cancelled_run([*spread(392, 0.05, 0.3), *[3.0] * 8]))
    result = gate(slow, "cancel_release_p99")
    assert result.status == Status.FAIL
    assert result.evidence[0]["request_id"] == "c392" and result.evidence[0]["value"] == 3.0


def test_never_released_request_fails_release(judge: Judge) -> None:
    result = gate(judge(cancelled_run([0.1, None])), "cancel_release_p99")
    assert result.status == Status.FAIL
    assert result.evidence[0]["request_id"] == "c1"
    assert "never released" in result.evidence[0]["detail"]
    assert result.value == np.inf and result.censored == 1


def test_a_look_waits_for_a_recent_cancellations_release(tmp_path: Path) -> None:
    """Mid-run, the last cancellation (at +40 s, the events reaching +39 s) has no release
    yet: it may still be on its way, so a look leaves it out rather than read +inf. The
    same record at the end of the run is a leak."""
    b = cancelled_run([*[0.1] * 19, None])
    b.meta["status"] = "running"
    params = {"skew_s": 0.5}
    look = cancel_release_latency(load_run(b.write(tmp_path / "look")), GateFilter(), params)
    assert look.n_samples == 19 and np.isfinite(look.frame["value"]).all()
    b.meta["status"] = "completed"
    end = cancel_release_latency(load_run(b.write(tmp_path / "end")), GateFilter(), params)
    assert end.n_samples == 20 and np.isinf(end.frame["value"]).sum() == 1


def test_release_falls_back_to_the_histogram(judge: Judge) -> None:
    b = RunBuilder()
    for t, counts in ((20, (0, 0, 0)), (90, (10, 10, 10))):
        for le, count in zip(("0.5", "2.5", "+Inf"), counts, strict=True):
            b.sample("kvgate_release_latency_seconds_bucket", count, t, labels=f"le={le}")
    result = gate(judge(b), "cancel_release_p99")
    assert result.n_samples == 10 and result.value == 0.5
    assert result.status == Status.INVALID  # ten cancellations cannot show a p99
    assert result.needs_n == 368
    assert any("histogram" in n for n in result.notes)
    enough = RunBuilder()
    for t, counts in ((20, (0, 0, 0)), (90, (400, 400, 400))):
        for le, count in zip(("0.5", "2.5", "+Inf"), counts, strict=True):
            enough.sample("kvgate_release_latency_seconds_bucket", count, t, labels=f"le={le}")
    assert gate(judge(enough), "cancel_release_p99").status == Status.PASS


def test_tenant_at_16_percent_fails_the_cap(judge: Judge) -> None:
    b = RunBuilder()
    for t in range(10, 100, 10):
        b.sample("kvgate_tenant_pool_share", 0.10, t, labels="tenant=acme")
        b.sample("kvgate_tenant_pool_share", 0.16 if t == 50 else 0.12, t, labels="tenant=globex")
    result = gate(judge(b), "tenant_share_cap")
    assert result.status == Status.FAIL and result.value == 0.16
    assert result.evidence[0]["tenant"] == "globex"
    assert result.first_breach_t == 1_000_050.0


def test_tenant_share_rebuilt_from_events(judge: Judge) -> None:
    b = RunBuilder()
    b.event("admitted", 20, request_id="x", tenant="globex", blocks=100)
    b.event("admitted", 21, request_id="y", tenant="globex", blocks=60)  # 160 / 1000 blocks
    b.event("released", 22, request_id="x", tenant="globex", blocks=100)
    b.event("admitted", 23, request_id="z", tenant="acme", blocks=140)
    result = gate(judge(b), "tenant_share_cap")
    assert result.status == Status.FAIL and result.value == 0.16
    assert result.evidence[0]["tenant"] == "globex"
    assert any("rebuilt" in n for n in result.notes)


def test_tenant_at_14_percent_passes_on_enough_samples(judge: Judge) -> None:
    b = RunBuilder().sample("kvgate_tenant_pool_share", 0.14, 50, labels="tenant=acme")
    thin = gate(judge(b), "tenant_share_cap")
    assert thin.status == Status.INVALID and thin.needs_n == 30
    for t in range(30):
        b.sample("kvgate_tenant_pool_share", 0.14, 20 + t, labels="tenant=acme")
    assert gate(judge(b), "tenant_share_cap").status == Status.PASS


def fast_requests(n: int, ttft: float = 0.1, **fields: object) -> RunBuilder:
    b = RunBuilder()
    for i in range(n):
        b.request(f"r{i}", t=20 + i * 0.1, ttft_s=ttft, **fields)
    return b


def test_cpu_warning_makes_the_run_invalid(tmp_path: Path) -> None:
    b = fast_requests(100, priority="critical")
    b.meta["cpu_warning"] = True
    b.meta["cpu_warnings"] = [{"t": 1.0, "worker": "w1", "cpu_percent": 97.0}]
    gates = gate_file(
        tmp_path / "g.yaml", '  - {id: t, title: T, metric: ttft, pass: "p(95) < 1s"}'
    )
    verdict = evaluate(load_run(b.write(tmp_path / "run")), load_gate_file(gates))
    assert verdict.gates[0].status == Status.PASS
    assert verdict.status == Status.INVALID and verdict.exit_code == 5
    assert "CPU warning" in verdict.run_problems[0] and "w1" in verdict.run_problems[0]


def test_gates_without_data_do_not_drag_the_score_into_fail(tmp_path: Path) -> None:
    """Non-key gates that had nothing to judge make the run MARGINAL (a human looks), not
    FAIL: missing data is never a silent pass, and never a silent failure either."""
    b = fast_requests(100, priority="critical")
    gates = gate_file(
        tmp_path / "g.yaml",
        '  - {id: t, title: T, metric: ttft, pass: "p(95) < 1s", key: true,\n'
        "     blocks: slow critical answers}",
        '  - {id: p, title: P, metric: preempted_completion, pass: "rate > 0.99"}',
        '  - {id: f, title: F, metric: failover_integrity, pass: "count == 0"}',
    )
    verdict = evaluate(load_run(b.write(tmp_path / "run")), load_gate_file(gates))
    assert [g.status for g in verdict.gates] == [Status.PASS, Status.INVALID, Status.INVALID]
    assert verdict.score == 1.0
    assert verdict.status == Status.MARGINAL and verdict.exit_code == 4


def test_simulator_lag_beyond_bound_makes_the_run_invalid(tmp_path: Path) -> None:
    b = fast_requests(100)
    b.meta["sim_lag_ms_p99"], b.meta["sim_lag_bound_ms"] = 80.0, 50.0
    gates = gate_file(
        tmp_path / "g.yaml", '  - {id: t, title: T, metric: ttft, pass: "p(95) < 1s"}'
    )
    verdict = evaluate(load_run(b.write(tmp_path / "run")), load_gate_file(gates))
    assert verdict.status == Status.INVALID
    assert "lagged" in verdict.run_problems[0]


def test_oom_row_fails_gate_1(judge: Judge) -> None:
    clean = RunBuilder().event("admitted", 20, request_id="a")
    assert gate(judge(clean), "no_oom").status == Status.PASS
    oom = (
        RunBuilder()
        .event("admitted", 20, request_id="a")
        .event("oom", 50, replica="r1", reason="CUDA OOM")
    )
    result = gate(judge(oom), "no_oom")
    assert result.status == Status.FAIL and result.value == 1
    assert result.evidence[0]["replica"] == "r1" and result.first_breach_t == 1_000_050.0


def test_an_oom_fails_the_run_even_when_other_key_gates_lack_data(judge: Judge) -> None:
    """Every replica died, so nothing was cancelled and released: that gate has no data, but
    an OOM is a breach no missing data can excuse (naive policy under long context)."""
    b = (
        RunBuilder()
        .request("a", ttft_s=0.1)
        .event("admitted", 20, request_id="a")
        .event("oom", 50, replica="r0", reason="CUDA OOM")
    )
    b.meta["cpu_warning"] = True
    verdict = judge(b)
    assert gate(verdict, "cancel_release_p99").status == Status.INVALID
    assert verdict.status == Status.FAIL and verdict.exit_code == 3


def test_a_latency_failure_in_an_invalid_run_stays_invalid(judge: Judge) -> None:
    """A slow release measured while the load generator was starved proves nothing."""
    b = cancelled_run([0.2, 0.3, 3.0])
    b.meta["cpu_warning"] = True
    verdict = judge(b)
    assert gate(verdict, "cancel_release_p99").status == Status.FAIL
    assert verdict.status == Status.INVALID


def test_oom_signals_from_deaths_and_counters_and_the_window(judge: Judge) -> None:
    died = RunBuilder().event("replica_died", 50, reason="exit 1: CUDA out of memory")
    assert gate(judge(died), "no_oom").status == Status.FAIL
    other = RunBuilder().event("replica_died", 50, reason="killed by fault f1")
    assert gate(judge(other), "no_oom").status == Status.PASS
    counter = RunBuilder().sample("kvgate_oom_total", 0, 20).sample("kvgate_oom_total", 1, 30)
    assert gate(judge(counter), "no_oom").status == Status.FAIL


@pytest.mark.parametrize("t", [3.0, 15.0, 110.0], ids=["idle", "ramp", "drain"])
def test_an_oom_outside_the_stress_window_still_fails_the_run(judge: Judge, t: float) -> None:
    b = RunBuilder().event("admitted", 20, request_id="a").event("oom", t, reason="CUDA OOM")
    b.meta["windows"]["stress"] = [b.meta["t_start"] + 20, b.meta["t_start"] + 100]
    verdict = judge(b)
    assert gate(verdict, "no_oom").status == Status.FAIL
    assert verdict.status == Status.FAIL


def test_missing_stress_window_is_invalid(tmp_path: Path) -> None:
    b = RunBuilder().event("oom", 50)
    b.meta["windows"] = {}
    gates = gate_file(
        tmp_path / "g.yaml",
        '  - {id: o, title: O, metric: oom_events, filter: {window: stress}, pass: "count == 0"}',
    )
    result = evaluate(load_run(b.write(tmp_path / "run")), load_gate_file(gates)).gates[0]
    assert result.status == Status.INVALID and "meta.windows.stress" in result.message


def batch_requests(b: RunBuilder, n: int, prefix: str = "b", **fields: Any) -> RunBuilder:
    """`n` batch requests; by default refused explicitly (503 with Retry-After)."""
    ending: dict[str, Any] = {
        "outcome": "rejected",
        "http_status": 503,
        "retry_after_s": 1,
    } | fields
    for i in range(n):
        b.request(f"{prefix}{i}", priority="batch", traffic_class="batch", **ending)
    return b


def test_low_priority_timeouts_fail_explicit_errors(judge: Judge) -> None:
    b = batch_requests(RunBuilder(), 400)
    assert gate(judge(b), "low_priority_explicit_errors").status == Status.PASS
    batch_requests(b, 5, "late", outcome="timeout", http_status=None, retry_after_s=None)
    result = gate(judge(b), "low_priority_explicit_errors")
    assert result.status == Status.FAIL and result.evidence[0]["request_id"] == "late0"


def test_batch_answered_with_500s_is_not_an_explicit_refusal(judge: Judge) -> None:
    b = batch_requests(RunBuilder(), 400, outcome="error", http_status=500, retry_after_s=None)
    result = gate(judge(b), "low_priority_explicit_errors")
    assert result.status == Status.FAIL and result.value == 0.0 and result.n_samples == 400
    assert any("400 error/500" in n for n in result.notes)


def replica_failed(b: RunBuilder, n: int) -> RunBuilder:
    """`n` batch streams sent at 20 s on r1 that the gateway ended as "replica failed" at 21 s."""
    return batch_requests(
        b,
        n,
        "k",
        outcome="error",
        http_status=200,
        error_code="replica_failed",
        retry_after_s=None,
        replica="r1",
        e2e_s=1.0,
    )


def test_batch_cut_short_by_a_killed_replica_is_not_judged_as_a_refusal(judge: Judge) -> None:
    b = replica_failed(batch_requests(RunBuilder(), 400, http_status=429), 20).fault(20.5)
    result = gate(judge(b), "low_priority_explicit_errors")
    assert result.status == Status.PASS and result.n_samples == 400
    assert any("20 requests cut short" in n for n in result.notes)


def test_replica_failed_with_no_death_behind_it_is_a_failure(judge: Judge) -> None:
    """The gateway says "replica failed" but the replica lived on (it dropped the stream
    itself), or died only long after: the requests count against the server."""
    b = replica_failed(batch_requests(RunBuilder(), 400, http_status=429), 20).fault(40.0)
    result = gate(judge(b), "low_priority_explicit_errors")
    assert result.status == Status.FAIL and result.n_samples == 420


def test_preempted_requests_must_complete(judge: Judge) -> None:
    assert gate(judge(preempted(400)), "preempted_complete").status == Status.PASS
    result = gate(judge(preempted(396, lost=4)), "preempted_complete")
    assert result.status == Status.FAIL and result.value == 0.99
    assert result.evidence[0]["request_id"] == "lost0"


def test_a_preempted_request_that_ends_ok_without_running_to_its_end_did_not_complete(
    judge: Judge,
) -> None:
    """An `ok` ending alone is no completion: a request given up after its preemption may
    still close its stream cleanly. It completed when it ran again after its last
    preemption and finished normally, with every token it asked for unless it stopped."""
    b = preempted(400)
    given_up = {
        "abort": FINISHED | {"finish_reason": "abort"},  # vLLM gave it up
        "short": FINISHED | {"completion_tokens": 3},  # `length` after 3 of 64 tokens
        "silent": FINISHED | {"finish_reason": None},  # never said it finished
    }
    for rid, fields in given_up.items():
        b.request(rid, **fields).event("preempted", 30, request_id=rid)
        b.event("resumed", 31, request_id=rid)
    b.request("never", **FINISHED).event("preempted", 30, request_id="never")
    b.request("again", **FINISHED).event("preempted", 30, request_id="again")
    b.event("resumed", 31, request_id="again").event("preempted", 32, request_id="again")
    # complete: a natural stop short of max_tokens; a retry admitted on another replica
    b.request("stopped", **FINISHED | {"completion_tokens": 20, "finish_reason": "stop"})
    b.event("preempted", 30, request_id="stopped").event("resumed", 31, request_id="stopped")
    b.request("moved", **FINISHED).event("preempted", 30, request_id="moved")
    b.event("admitted", 31, replica="r1", request_id="moved")
    result = gate(judge(b), "preempted_complete")
    assert result.status == Status.FAIL and result.n_samples == 407
    assert result.value == 402 / 407
    why = {e["request_id"]: e["detail"].split(" ", 1)[1] for e in result.evidence}
    assert why == {
        "abort": "finished abort",
        "short": "finished length after 3 of 64 tokens",
        "silent": "finished without a finish_reason",
        "never": "never resumed after its last preemption",
        "again": "never resumed after its last preemption",
    }
    assert any("2 never resumed after its last preemption" in n for n in result.notes)


def test_preempted_requests_cut_short_by_a_kill_are_not_starvation(judge: Judge) -> None:
    b = preempted(400).fault(31.0, target="r0")
    b.request("killed", t=25, outcome="error", error_code="replica_failed", replica="r0", e2e_s=6)
    b.event("preempted", 30, request_id="killed")
    b.request("ended", outcome="cancelled", error_code="user_stopped")
    b.event("preempted", 30, request_id="ended")
    result = gate(judge(b), "preempted_complete")
    assert result.status == Status.PASS and result.n_samples == 400
    assert any("2 preempted requests left out" in n for n in result.notes)


def test_preempted_requests_dropped_by_a_live_replica_do_not_complete(judge: Judge) -> None:
    """A stream ended as "replica failed" while no replica died is a lost request."""
    b = preempted(400)
    b.request("dropped", t=25, outcome="error", error_code="replica_failed", replica="r0", e2e_s=6)
    b.event("preempted", 30, request_id="dropped")
    result = gate(judge(b), "preempted_complete")
    assert result.n_samples == 401 and result.value is not None and result.value < 1.0


def test_a_preempted_request_the_server_let_go_is_lost_even_if_a_kill_ends_it_later(
    judge: Judge,
) -> None:
    """The replica released the request at 30 s and never told its client, which waited
    until the replica was killed at 45 s: the kill did not cut it short, the server lost it.
    One released a moment before the kill is still the kill's."""
    b = preempted(400).fault(45.0, target="r0")
    hung = {"outcome": "error", "error_code": "replica_failed", "replica": "r0"}
    b.request("hung", t=25, e2e_s=20.5, **hung)
    b.event("preempted", 30, request_id="hung").event("released", 30, request_id="hung")
    b.request("cut", t=25, e2e_s=20.5, **hung)
    b.event("preempted", 30, request_id="cut").event("released", 44.9, request_id="cut")
    result = gate(judge(b), "preempted_complete")
    assert result.n_samples == 401 and result.status == Status.MARGINAL
    assert result.evidence[0]["request_id"] == "hung"
    assert any("1 preempted requests left out" in n for n in result.notes)


def victims(batch: int, critical: int = 0, reason: str = "pressure") -> RunBuilder:
    b = RunBuilder()
    for i in range(batch):
        b.event("preempted", 30, request_id=f"b{i}", priority="batch", reason="pressure")
    for i in range(critical):
        b.event("preempted", 31, request_id=f"c{i}", priority="critical", reason=reason)
    return b


def test_critical_work_is_preempted_only_at_risk(judge: Judge) -> None:
    assert gate(judge(victims(30)), "critical_not_preempted").status == Status.PASS
    assert gate(judge(victims(29)), "critical_not_preempted").status == Status.MARGINAL
    at_risk = gate(judge(victims(30, critical=2, reason="at_risk")), "critical_not_preempted")
    assert at_risk.status == Status.PASS and at_risk.n_samples == 32
    result = gate(judge(victims(30, critical=2)), "critical_not_preempted")
    assert result.status == Status.FAIL and result.value == 2
    assert result.evidence[0]["request_id"] == "c0"


def test_no_preemption_leaves_the_victim_order_unjudged(judge: Judge) -> None:
    result = gate(judge(preempted(0).request("q")), "critical_not_preempted")
    assert result.status == Status.INVALID and "no request was preempted" in result.message


def test_memory_must_return_to_idle(judge: Judge) -> None:
    def run(after: float) -> RunBuilder:
        b = RunBuilder().sample("kvgate_pool_blocks_total", 1000, 5)
        for t, used in ((2, 10), (5, 10), (50, 900), (112, after), (118, after)):
            b.sample("kvgate_pool_used_blocks", used, t)
        return b

    assert gate(judge(run(20)), "memory_back_to_idle").status == Status.PASS
    assert gate(judge(run(40)), "memory_back_to_idle").status == Status.MARGINAL
    held = gate(judge(run(300)), "memory_back_to_idle")
    assert held.status == Status.FAIL and held.value == 0.29


def test_failover_double_reservation_and_ledger_drift(judge: Judge) -> None:
    ok = RunBuilder().fault(40, target="r0").fault(80, target="r1")
    ok.event("admitted", 30, replica="r0", request_id="m").event(
        "admitted", 41, replica="r1", request_id="m"
    )
    ok.sample("kvgate_gateway_ledger_drift_tokens", 500, 41, target="gateway")
    ok.sample("kvgate_gateway_ledger_drift_tokens", 0, 42.5, target="gateway")
    assert gate(judge(ok), "failover_no_double_reservation").status == Status.PASS
    one_kill = RunBuilder().fault(40, target="r0").event("admitted", 30, request_id="a")
    thin = gate(judge(one_kill), "failover_no_double_reservation")
    assert thin.status == Status.MARGINAL and thin.needs_n == 2
    twice = RunBuilder().fault(40, target="r2")
    twice.event("admitted", 30, replica="r0", request_id="m").event(
        "admitted", 41, replica="r1", request_id="m"
    )
    result = gate(judge(twice), "failover_no_double_reservation")
    assert result.status == Status.FAIL and result.evidence[0]["request_id"] == "m"
    drift = RunBuilder().fault(40, target="r0").event("admitted", 30, request_id="a")
    for t, tokens in (
        (39, 0),
        (40, 0),
        (41, 300),
        (42, 500),
        (43, 500),
        (44, 500),
        (45, 500),
        (46, 0),
    ):
        drift.sample("kvgate_gateway_ledger_drift_tokens", tokens, t, target="gateway")
    result = gate(judge(drift), "failover_no_double_reservation")
    assert result.status == Status.FAIL
    assert "up to 500 tokens) in all 4 samples 2-5.0s after fault" in result.evidence[0]["detail"]


def test_transient_drift_that_settles_in_time_passes(judge: Judge) -> None:
    b = RunBuilder().fault(40, target="r0").fault(80, target="r1")
    b.event("admitted", 30, request_id="a")
    for t, tokens in ((38, 900), (39, 0), (40.5, 700), (41.5, 0), (42.5, 300), (43.5, 0)):
        b.sample("kvgate_gateway_ledger_drift_tokens", tokens, t, target="gateway")
    assert gate(judge(b), "failover_no_double_reservation").status == Status.PASS


def test_no_kill_means_no_failover_data(judge: Judge) -> None:
    result = gate(
        judge(RunBuilder().event("admitted", 30, request_id="a")), "failover_no_double_reservation"
    )
    assert result.status == Status.INVALID


def batch_run(peak: int, trough: int, waiting: int = 1, offered: int = 40) -> RunBuilder:
    """Two peaks [10, 30], [50, 70] and two troughs [30, 50], [70, 90]. Each peak is offered
    `offered` batch requests and admits `peak` of them (the rest are refused with 503); each
    trough is offered and admits `trough`; `waiting` batch requests sent at 5 s were never
    admitted. Requests are sent from 2 s into each phase, once it has settled."""
    b = RunBuilder()
    t0 = b.meta["t_start"]
    b.meta["phases"] = [
        {"name": name, "t0": t0 + start, "t1": t0 + start + 20}
        for name, start in (("peak", 10), ("trough", 30), ("peak", 50), ("trough", 70))
    ]
    for i in range(waiting):
        b.request(f"q{i}", t=5, priority="batch", traffic_class="batch", outcome="timeout")
    for start, sent, admitted, kind in (
        (10, max(offered, peak), peak, "p"),
        (30, trough, trough, "t"),
        (50, max(offered, peak), peak, "p"),
        (70, trough, trough, "t"),
    ):
        for i in range(sent):
            rid = f"{kind}{start}-{i}"
            t = start + 2 + 0.1 * i
            if i < admitted:
                b.request(rid, t=t, priority="batch", traffic_class="batch", e2e_s=1.0)
                b.event("admitted", t + 0.05, request_id=rid, priority="batch")
            else:
                b.request(
                    rid,
                    t=t,
                    priority="batch",
                    traffic_class="batch",
                    outcome="rejected",
                    http_status=503,
                    retry_after_s=1.0,
                    e2e_s=0.01,
                )
    return b


def test_batch_must_pause_at_peak_and_resume_in_trough(judge: Judge) -> None:
    assert gate(judge(batch_run(0, 40)), "batch_stops_at_peak").status == Status.PASS
    busy = gate(judge(batch_run(20, 40)), "batch_stops_at_peak")
    assert busy.status == Status.FAIL and "peak admitted" in busy.evidence[0]["detail"]
    starved = gate(judge(batch_run(0, 0)), "batch_stops_at_peak")
    assert starved.status == Status.FAIL and "starved" in starved.evidence[0]["detail"]


def test_an_empty_trough_queue_is_not_starvation(judge: Judge) -> None:
    """Troughs that admit nothing because nothing waits: no breach; with no admissions at
    all, nothing shows that batch stops at peak either, so the gate cannot pass."""
    b = batch_run(0, 0, waiting=0)
    b.request("done", t=2, priority="batch", traffic_class="batch", e2e_s=1.0)
    b.event("admitted", 2.1, request_id="done", priority="batch")
    result = gate(judge(b), "batch_stops_at_peak")
    assert result.status == Status.MARGINAL and result.breaches == 0
    assert "starved" not in result.message and "either way" in result.message


def test_batch_sent_while_a_phase_settles_counts_in_neither_share(judge: Judge) -> None:
    """Room freed by trough work ending lets batch in before the peak's online requests
    arrive: requests sent in the first second of a phase are not evidence either way."""
    b = batch_run(0, 40)
    for start in (10, 50):
        for i in range(20):
            rid = f"edge{start}-{i}"
            b.request(rid, t=start + 0.04 * i, priority="batch", traffic_class="batch", e2e_s=1)
            b.event("admitted", start + 0.9, request_id=rid, priority="batch")
    assert gate(judge(b), "batch_stops_at_peak").status == Status.PASS
    late = batch_run(0, 40)
    for start in (10, 50):
        for i in range(20):
            rid = f"late{start}-{i}"
            late.request(rid, t=start + 1.1 + 0.04 * i, priority="batch", traffic_class="batch")
            late.event("admitted", start + 2.0, request_id=rid, priority="batch")
    assert gate(judge(late), "batch_stops_at_peak").status == Status.FAIL


def test_requests_refused_at_a_peak_are_not_waiting_in_a_later_idle_trough(judge: Judge) -> None:
    """Each peak refuses the 40 batch requests sent in it (503 with its `rejected` event, or
    429); the first trough admits its own work and the second is offered none. A refusal
    ended the request, whether or not its record says when: nothing waits in the idle
    trough. One refused only after it had queued 10 s in that trough did wait there."""
    b = RunBuilder()
    t0 = b.meta["t_start"]
    b.meta["phases"] = [
        {"name": name, "t0": t0 + start, "t1": t0 + start + 20}
        for name, start in (("peak", 10), ("trough", 30), ("peak", 50), ("trough", 70))
    ]
    batch = {"priority": "batch", "traffic_class": "batch"}
    for start in (10, 50):
        for i in range(40):
            rid, t = f"p{start}-{i}", start + 2 + 0.1 * i
            if i % 2:
                b.request(rid, t=t, outcome="rejected", http_status=429, **batch)
            else:
                b.request(rid, t=t, outcome="rejected", http_status=503, retry_after_s=1, **batch)
                b.event("rejected", t + 0.01, request_id=rid, priority="batch", reason="capacity")
    for i in range(40):
        b.request(f"t{i}", t=32 + 0.1 * i, e2e_s=1.0, **batch)
        b.event("admitted", 32.05 + 0.1 * i, request_id=f"t{i}", priority="batch")
    assert gate(judge(b), "batch_stops_at_peak").status == Status.PASS
    b.request("late", t=71, outcome="rejected", http_status=503, retry_after_s=1, **batch)
    b.event("queued", 71, request_id="late", priority="batch")
    b.event("rejected", 81, request_id="late", priority="batch", reason="deadline_expired")
    starved = gate(judge(b), "batch_stops_at_peak")
    assert starved.status == Status.FAIL and "1 waited" in starved.evidence[0]["detail"]


def test_a_peak_with_too_few_requests_to_tell_is_not_a_breach(judge: Judge) -> None:
    """1 of 3 batch requests admitted in each peak against all of them in the troughs: above
    the 0.2x line, but three requests cannot show it at 95%: MARGINAL, never FAIL or PASS."""
    result = gate(judge(batch_run(1, 3, offered=3)), "batch_stops_at_peak")
    assert result.status == Status.MARGINAL and "too few requests" in result.message


def test_a_peak_offered_no_batch_work_proves_nothing(judge: Judge) -> None:
    """The load shape alone keeps batch out of the peaks: no evidence that the server does."""
    result = gate(judge(batch_run(0, 40, offered=0)), "batch_stops_at_peak")
    assert result.status == Status.MARGINAL and result.breaches == 0
    assert "offered no batch work" in result.message


def test_a_peak_near_the_line_is_read_with_the_other_peaks(judge: Judge) -> None:
    """The first peak admits 5 of 50 against all in the troughs: under the 0.2x line, but
    its own interval reaches over it. With the second peak's 0 of 40, the peaks together
    are clearly under it: PASS. A longer run has more peaks, and one of them landing near
    the line must not leave the gate unsure for good."""
    b = batch_run(0, 40)
    for i in range(10):
        rid, t = f"near{i}", 25 + 0.1 * i
        if i < 5:
            b.request(rid, t=t, priority="batch", traffic_class="batch", e2e_s=1.0)
            b.event("admitted", t + 0.05, request_id=rid, priority="batch")
        else:
            b.request(
                rid,
                t=t,
                priority="batch",
                traffic_class="batch",
                outcome="rejected",
                http_status=503,
                retry_after_s=1.0,
                e2e_s=0.01,
            )
    assert gate(judge(b), "batch_stops_at_peak").status == Status.PASS


def test_batch_share_admitted_at_peak_is_judged_per_request_offered(judge: Judge) -> None:
    """Few peak admissions in absolute terms can still be a breach: 8 of 10 offered."""
    result = gate(judge(batch_run(8, 40, offered=10)), "batch_stops_at_peak")
    assert result.status == Status.FAIL and "8 of 10" in result.evidence[0]["detail"]


def peak_trough_reading(b: RunBuilder, path: Path) -> Observations:
    params = {"peak_ratio_max": 0.2, "starve_after_s": 5.0, "settle_s": 1.0}
    return batch_peak_trough(load_run(b.write(path)), GateFilter(), params)


def test_a_look_mid_run_does_not_read_the_phase_still_going_on(tmp_path: Path) -> None:
    """Mid-run, the last trough has admitted nothing 10 s in while batch work waits: the
    scheduler may admit it later in that trough, so a look does not read it as starved; the
    same trough, whole at the end, is."""
    b = batch_run(0, 40)
    b.meta["phases"].append({"name": "trough", "t0": T0 + 90, "t1": T0 + 100, "open": True})
    b.meta["status"] = "running"
    for i in range(10):
        b.request(f"w{i}", t=90.5, priority="batch", traffic_class="batch", outcome="timeout")
    look = peak_trough_reading(b, tmp_path / "look")
    assert look.frame.empty and not look.unsure
    b.meta["phases"][-1]["open"] = False
    b.meta["status"] = "completed"
    end = peak_trough_reading(b, tmp_path / "end")
    assert ["starved" in d for d in end.frame["detail"]] == [True]


def test_a_look_counts_a_peaks_batch_requests_still_in_flight_by_the_servers_events(
    tmp_path: Path,
) -> None:
    """A peak that admitted 5 of the 80 batch requests sent in it. Mid-run only those 5 have
    ended; the 75 others still wait, seen by the server, with no record yet. From records
    alone the look would read 5 of 5, a breach; it counts the 75 by the server's events,
    and reads 5 of 80, as the records at the end will. Until the events reach past the
    peak's end, it cannot tell what was admitted in it: unsure."""
    b = batch_run(0, 40)
    for i in range(80):
        rid, t = f"late{i}", 92 + 0.1 * i
        b.event("queued", t + 0.01, request_id=rid, priority="batch")
        if i < 5:
            b.request(rid, t=t, priority="batch", traffic_class="batch", e2e_s=1.0)
            b.event("admitted", t + 0.05, request_id=rid, priority="batch")
    b.meta["phases"].append({"name": "peak", "t0": T0 + 90, "t1": T0 + 110})
    b.meta["status"] = "running"
    early = peak_trough_reading(b, tmp_path / "early")  # the events end at 100 s
    assert early.frame.empty
    assert any("75 batch requests sent in it are still in flight" in u for u in early.unsure)
    b.event("queued", 113, request_id="next", priority="batch")  # the events reach 113 s
    look = peak_trough_reading(b, tmp_path / "look")
    assert look.frame.empty and not look.unsure
    records_only = batch_run(0, 40)
    for i in range(5):
        rid, t = f"late{i}", 92 + 0.1 * i
        records_only.request(rid, t=t, priority="batch", traffic_class="batch", e2e_s=1.0)
        records_only.event("admitted", t + 0.05, request_id=rid, priority="batch")
    records_only.meta["phases"].append({"name": "peak", "t0": T0 + 90, "t1": T0 + 110})
    assert len(peak_trough_reading(records_only, tmp_path / "records").frame) == 1
    for i in range(5, 80):
        b.request(f"late{i}", t=92 + 0.1 * i, priority="batch", traffic_class="batch", e2e_s=20)
    b.meta["status"] = "completed"
    end = peak_trough_reading(b, tmp_path / "end")
    assert end.frame.empty and not end.unsure


def test_warn_threshold_makes_marginal_and_exit_4(tmp_path: Path) -> None:
    b = fast_requests(100, ttft=0.85, priority="critical")
    gates = gate_file(
        tmp_path / "g.yaml",
        "  - {id: t, title: T, metric: ttft, key: true, blocks: slow critical answers,\n"
        '     pass: "p(95) <= 900ms", warn: "p(95) <= 800ms"}',
    )
    verdict = evaluate(load_run(b.write(tmp_path / "run")), load_gate_file(gates))
    assert verdict.gates[0].status == Status.MARGINAL
    assert verdict.status == Status.MARGINAL and verdict.exit_code == 4
