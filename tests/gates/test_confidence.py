"""Judging with confidence: the worst requests count, thin evidence never passes.

Known-answer run directories built by hand; the answers are computed here independently.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gates import stats
from gates.evaluator import evaluate
from gates.rundir import load_run
from gates.spec import GateSpecError, load_gate_file
from gates.terms import Threshold
from gates.verdict import Status, Verdict
from tests.gates.builder import RunBuilder, gate_file, preempted
from tests.gates.conftest import gate

Judge = Callable[[RunBuilder], Verdict]


def critical(
    b: RunBuilder, n: int, ttft: float | None = 0.3, start: int = 0, **fields: object
) -> None:
    for i in range(start, start + n):
        b.request(
            f"c{i}", t=20 + i * 0.05, ttft_s=ttft, priority="critical", traffic_class="short_qa"
        )
        b.rows["requests"][-1].update(fields)


# -- no silent pass ---------------------------------------------------------------------------


def test_a_server_that_times_out_a_sixth_of_critical_requests_fails_ttft(judge: Judge) -> None:
    """500 fast answers and 100 timeouts with no first token: the 900 ms gate must not pass
    on the 500 that were answered."""
    b = RunBuilder()
    critical(b, 500, ttft=0.2)
    critical(b, 100, start=500, ttft=None, outcome="timeout", http_status=None)
    result = gate(judge(b), "ttft_critical_p95")
    assert result.status == Status.FAIL
    assert result.value == np.inf and result.censored == 100 and result.n_samples == 600
    assert result.interval is not None and result.interval[0] == np.inf  # conclusive
    assert "no first token" in result.evidence[0]["detail"]


def test_5xx_and_disconnects_count_but_client_cancels_and_429s_are_left_out(judge: Judge) -> None:
    b = RunBuilder()
    critical(b, 400, ttft=0.2)
    critical(b, 3, start=400, ttft=None, outcome="rejected", http_status=503)
    critical(b, 2, start=403, ttft=None, outcome="disconnected", http_status=200)
    critical(b, 5, start=405, ttft=None, outcome="cancelled", cancel_at=30.0)
    critical(b, 7, start=410, ttft=None, outcome="rejected", http_status=429)
    result = gate(judge(b), "ttft_critical_p95")
    assert result.n_samples == 405 and result.censored == 5
    assert any(
        "left out" in n and "5 cancelled" in n and "7 rejected 429" in n for n in result.notes
    )


def test_a_stream_that_never_carried_content_is_a_breach_not_a_refusal(judge: Judge) -> None:
    """HTTP 200 and [DONE] with not one content chunk: the server served nothing, so there
    is no first token and the request is a breach (+inf), never left out as a refusal is;
    alike whether it is recorded `ok` (as a client before `empty_stream` wrote it) or as the
    `empty_stream` error. Only a request that asked for no output may end empty."""
    b = RunBuilder()
    critical(b, 500, ttft=0.2, chunks=12, max_tokens=64)
    critical(b, 20, start=500, ttft=None, chunks=0, max_tokens=64)
    critical(b, 20, start=520, ttft=None, chunks=0, error_code="empty_stream", outcome="error")
    critical(b, 4, start=540, ttft=None, chunks=0, max_tokens=0)
    result = gate(judge(b), "ttft_critical_p95")
    assert result.status == Status.FAIL and result.value == np.inf
    assert result.censored == 40 and result.n_samples == 540
    assert {e["detail"] for e in result.evidence} == {"no first token: ok status=200 empty_stream"}
    assert any("left out" in n and "4 ok 200" in n for n in result.notes)


def test_a_leak_one_second_before_the_end_fails(judge: Judge) -> None:
    """400 prompt releases, and one cancellation at t_end - 1 s whose release never comes."""
    b = RunBuilder()
    for i in range(400):
        rid = f"k{i}"
        b.request(rid, t=20 + i * 0.1, traffic_class="cancel_storm", outcome="cancelled")
        b.rows["requests"][-1]["cancel_at"] = b.meta["t_start"] + 21 + i * 0.1
        b.event("admitted", 20.05 + i * 0.1, request_id=rid, tenant="acme", blocks=4)
        b.event("released", 21.05 + i * 0.1, request_id=rid, tenant="acme", blocks=4)
    for j in range(5):
        rid = f"leak{j}"
        b.request(rid, t=118, traffic_class="cancel_storm", outcome="cancelled", cancel_at=119.0)
        b.event("admitted", 118.1, request_id=rid, tenant="acme", blocks=4)
    result = gate(judge(b), "cancel_release_p99")
    assert result.status == Status.FAIL and result.value == np.inf and result.censored == 5
    assert result.evidence[0]["request_id"].startswith("leak")


def test_a_replica_death_releases_what_it_held(judge: Judge) -> None:
    """Cancelled on r1 at +30 s, r1 killed at +30.5 s: released by the death, not leaked."""
    b = RunBuilder().fault(30.5, target="r1")
    for i in range(400):
        rid = f"k{i}"
        b.request(rid, t=29, traffic_class="cancel_storm", outcome="cancelled", cancel_at=30.0)
        b.event("admitted", 29.1, replica="r1", request_id=rid, tenant="acme", blocks=4)
    result = gate(judge(b), "cancel_release_p99")
    assert result.censored == 0 and result.value == pytest.approx(0.5)
    assert result.status == Status.PASS
    assert any("freed by a replica's death" in n for n in result.notes)


def test_tenant_share_rebuilt_from_events_forgets_a_dead_replica(judge: Judge) -> None:
    """globex held 140 blocks on r0 when it died; after the restart it holds 100: the
    rebuilt share is 0.10 then, not 0.24."""
    b = RunBuilder()
    b.event("admitted", 20, request_id="x", tenant="globex", blocks=140)
    b.event("replica_died", 30, reason="killed by fault f0")
    b.event("replica_started", 35)
    b.event("admitted", 40, request_id="y", tenant="globex", blocks=100)
    for i in range(40):
        b.event("admitted", 41 + i, request_id=f"a{i}", tenant="acme", blocks=1)
    result = gate(judge(b), "tenant_share_cap")
    assert result.value == pytest.approx(0.14)
    assert result.status == Status.PASS


# -- evidence with its confidence -------------------------------------------------------------


@pytest.mark.parametrize(
    ("completed", "lost", "status", "needs"),
    [
        (1, 0, Status.MARGINAL, 381),
        (199, 1, Status.MARGINAL, None),
        (380, 0, Status.MARGINAL, 381),
        (381, 0, Status.PASS, None),
    ],
)
def test_more_than_99_percent_needs_the_wilson_bound(
    judge: Judge, completed: int, lost: int, status: Status, needs: int | None
) -> None:
    result = gate(judge(preempted(completed, lost)), "preempted_complete")
    assert result.status == status
    if status != Status.PASS:
        assert result.straddles and "straddles" in result.message
        big = result.needs_n is not None and result.needs_n > 1000
        assert result.needs_n == needs or (needs is None and big)
        assert "needs >=" in result.message
    lo, hi = stats.wilson(completed, completed + lost)
    assert result.interval == pytest.approx([lo, hi])


def test_percent_thresholds_are_exact() -> None:
    assert Threshold.model_validate("rate >= 95%").value == 0.95
    assert Threshold.model_validate("rate >= 95%").holds(190 / 200)
    assert Threshold.model_validate("p(95) <= 900ms").value == 0.9


def test_190_of_200_meets_95_percent_but_cannot_prove_it(tmp_path: Path) -> None:
    b = RunBuilder()
    for i in range(200):
        b.request(f"r{i}", outcome="timeout" if i < 10 else "ok")
    gates = gate_file(
        tmp_path / "g.yaml",
        '  - {id: ok, title: OK, metric: outcome_rate, params: {outcome: ok}, pass: "rate >= 95%"}',
    )
    result = evaluate(load_run(b.write(tmp_path / "run")), load_gate_file(gates)).gates[0]
    assert result.value == 0.95 and "meets rate >= 95%" in result.message
    assert result.status == Status.MARGINAL and result.straddles


def test_a_percentile_near_its_line_is_flagged_even_when_it_passes(judge: Judge) -> None:
    """p95 of 0.85 s over 100 requests: below 900 ms, but its order-statistics interval
    reaches past it, so the key gate cannot pass and the run is INVALID, not PASS."""
    b = RunBuilder()
    values = np.linspace(0.3, 0.92, 100)
    for i, v in enumerate(values):
        b.request(f"c{i}", ttft_s=float(v), priority="critical", traffic_class="short_qa")
    verdict = judge(b)
    result = gate(verdict, "ttft_critical_p95")
    assert result.value == pytest.approx(np.percentile(values, 95))
    assert result.value is not None and result.value < 0.9
    assert result.straddles and result.status == Status.INVALID
    assert verdict.status == Status.INVALID
    assert any("ttft_critical_p95" in p for p in verdict.run_problems)
    lo, hi = stats.percentile_interval(values, 95)
    assert result.interval == [lo, hi] and hi > 0.9
    assert "[" in result.value_text() and "n = 100" in result.value_text()


def test_order_statistic_interval_covers_the_true_quantile() -> None:
    """Coverage of the distribution-free interval, checked by simulation (>= 95%)."""
    rng = np.random.default_rng(7)
    true_p95 = float(np.exp(-1 + 0.8 * 1.6448536))  # lognormal(-1, 0.8)
    hits = 0
    for _ in range(400):
        lo, hi = stats.percentile_interval(rng.lognormal(-1, 0.8, 150), 95)
        hits += lo <= true_p95 <= hi
    assert hits / 400 >= 0.93  # 95% nominal; 400 trials leave ~1.1% standard error


def test_paired_median_difference_and_its_interval() -> None:
    """The median of the differences (not the difference of medians), and an interval that
    covers the true median difference at least 95% of the time, by simulation."""
    first, second = [1.0, 2.0, 10.0], [0.5, 2.5, 4.0]
    assert stats.median_difference(first, second)[0] == 0.5  # diffs 0.5, -0.5, 6
    assert stats.median_difference(first, second)[1:] == (-np.inf, np.inf)  # 3 pairs bound nothing
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(400):
        load = rng.lognormal(-1.5, 1.0, 40)  # both requests of a pair see the same load
        warm, cold = load + rng.normal(0.20, 0.01, 40), load + rng.normal(0.23, 0.01, 40)
        _median, lo, hi = stats.median_difference(warm, cold)
        hits += lo <= -0.03 <= hi
    assert hits / 400 >= 0.93
    with pytest.raises(ValueError, match="differ in length"):
        stats.median_difference([1.0], [1.0, 2.0])


def test_samples_needed_for_a_bounded_percentile() -> None:
    assert stats.order_ranks(72, 95)[1] == 72 and stats.order_ranks(71, 95)[1] == 72
    assert stats.order_ranks(368, 99)[1] == 368 and stats.order_ranks(367, 99)[1] == 368
    assert stats.wilson_needs_n(1.0, 0.99, above=True, strict=True) == 381
    assert stats.percentile([0.1, 0.2, np.inf], 50) == 0.2
    assert stats.percentile([0.1, 0.2, np.inf], 75) == np.inf


# -- the verdict's rules ----------------------------------------------------------------------


def test_only_non_key_gates_without_data_is_invalid_not_fail(tmp_path: Path) -> None:
    gates = gate_file(
        tmp_path / "g.yaml",
        '  - {id: p, title: P, metric: preempted_completion, pass: "rate > 0.99"}',
        '  - {id: f, title: F, metric: failover_integrity, pass: "count == 0"}',
    )
    verdict = evaluate(load_run(RunBuilder().write(tmp_path / "run")), load_gate_file(gates))
    assert verdict.status == Status.INVALID and verdict.exit_code == 5
    assert "no gate had data to judge" in verdict.run_problems


# -- gate files are checked against their metrics ---------------------------------------------


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            '{id: g, title: G, metric: failover_integrity, pass: "count == 0", '
            "params: {grace_s: soon}}",
            "params.grace_s: must be a number",
        ),
        (
            '{id: g, title: G, metric: outcome_rate, pass: "rate < 1%", params: {outcome: late}}',
            "params.outcome: must be one of ok, cancelled",
        ),
        (
            '{id: g, title: G, metric: preempted_completion, pass: "p(95) > 0.99"}',
            "is a rate metric and cannot be judged by p(95)",
        ),
        (
            '{id: g, title: G, metric: ttft, pass: "p(95) < 1", min_samples: 0}',
            "min_samples",
        ),
    ],
)
def test_bad_gate_entries_are_refused_at_load(tmp_path: Path, entry: str, problem: str) -> None:
    with pytest.raises(GateSpecError, match="gates\\[0\\]") as caught:
        load_gate_file(gate_file(tmp_path / "g.yaml", f"  - {entry}"))
    assert problem in str(caught.value)
