"""The clock check over hand-built runs whose server clock is off the client's by a known
offset: corrected when the records bound it tightly, INVALID when they cannot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates.evidence import Effect, Finding, check_evidence
from gates.evidence.checks_clock import agreed_bound
from gates.rundir import load_run
from gates.verdict import Status, Verdict
from tests.gates.builder import RunBuilder
from tests.gates.conftest import gate

Judge = Callable[[RunBuilder], Verdict]
CANCELS = 400  # enough for a p99 to PASS


def cancel_storm(
    release_s: float,
    theta: float,
    replica: str = "r0",
    b: RunBuilder | None = None,
    ttft: bool = True,
) -> RunBuilder:
    """Cancelled requests, each admitted 10-50 ms after it was sent, with its first token
    20 ms after that (or, without `ttft`, no token and only its answer's end), cancelled 1 s
    after sending and released `release_s` after the cancel: as the client saw it, with the
    server stamping its events `theta` seconds off the client's clock."""
    b = b or RunBuilder()
    for i in range(CANCELS):
        rid = f"{replica}-c{i}"
        t = 20 + i * 0.1
        admit = 0.01 + (i % 5) * 0.01
        b.request(
            rid,
            t=t,
            traffic_class="cancel_storm",
            outcome="cancelled",
            cancel_at=t + 1.0,
            e2e_s=1.0,
            ttft_s=admit + 0.02 if ttft else None,
            replica=replica,
        )
        b.event("admitted", t + admit + theta, replica, request_id=rid, blocks=4)
        b.event("released", t + 1.0 + release_s + theta, replica, request_id=rid, blocks=4)
    return b


def clock_findings(verdict: Verdict) -> list[Finding]:
    return [
        Finding.from_dict(f) for f in verdict.evidence["findings"] if f["check"] == "clock_offset"
    ]


def test_a_server_clock_behind_the_client_no_longer_makes_slow_releases_read_instant(
    judge: Judge,
) -> None:
    """Releases 3 s after the cancel, stamped by a clock 4 s behind, sit 1 s before it."""
    verdict = judge(cancel_storm(release_s=3.0, theta=-4.0))
    result = gate(verdict, "cancel_release_p99")
    assert result.status == Status.FAIL
    assert result.value == pytest.approx(3.0, abs=0.03)
    (note,) = clock_findings(verdict)
    assert note.effect == Effect.NOTE and note.table == "server_events" and note.column == "t"
    assert "behind" in note.message and "4.0" in note.message
    assert note.n_rows == 2 * CANCELS
    assert any("clock_offset" in n for n in verdict.notes)


def test_a_server_clock_ahead_of_the_client_no_longer_fails_a_good_server(judge: Judge) -> None:
    verdict = judge(cancel_storm(release_s=0.2, theta=4.0))
    result = gate(verdict, "cancel_release_p99")
    assert result.status == Status.PASS
    assert result.value == pytest.approx(0.2, abs=0.03)
    (note,) = clock_findings(verdict)
    assert "ahead of" in note.message


def test_an_offset_the_records_cannot_bound_tightly_makes_the_run_invalid(judge: Judge) -> None:
    """Without first tokens, each request bounds the offset only to its 1 s answer."""
    verdict = judge(cancel_storm(release_s=0.2, theta=-5.0, ttft=False))
    (finding,) = clock_findings(verdict)
    assert finding.effect == Effect.INVALID and finding.doubts_timing
    assert "cannot be corrected" in finding.message and "[-5.9" in finding.message
    assert verdict.status == Status.INVALID
    assert any("clock_offset" in p for p in verdict.run_problems)


def test_a_leak_still_fails_a_run_whose_clocks_cannot_be_reconciled(judge: Judge) -> None:
    """A release that never comes is no matter of clocks: the run FAILs, not INVALID."""
    b = cancel_storm(release_s=0.2, theta=-5.0, ttft=False)
    b.rows["server_events"] = [
        r for r in b.rows["server_events"] if not (r["event"] == "released" and r["seq"] < 40)
    ]
    verdict = judge(b)
    assert clock_findings(verdict)[0].doubts_timing
    assert gate(verdict, "cancel_release_p99").value == np.inf
    assert verdict.status == Status.FAIL


def test_a_few_late_stamps_are_outvoted_and_named(judge: Judge) -> None:
    b = cancel_storm(release_s=0.2, theta=0.0)
    for row in b.rows["server_events"][:6:2]:  # three admissions stamped 2 s late
        row["t"] += 2.0
    verdict = judge(b)
    (note,) = clock_findings(verdict)
    assert note.effect == Effect.NOTE and note.n_rows == 3 and note.rows == (0, 2, 4)
    assert "3 of 400 requests" in note.message and "left out" in note.message
    assert not any("clock" in p for p in verdict.run_problems)


def test_a_clock_that_stepped_mid_run_agrees_on_no_offset(judge: Judge) -> None:
    b = cancel_storm(release_s=0.2, theta=0.0)
    for row in b.rows["server_events"][len(b.rows["server_events"]) // 2 :]:
        row["t"] += 3.0
    (finding,) = clock_findings(judge(b))
    assert finding.effect == Effect.INVALID and finding.doubts_timing
    assert "no single offset" in finding.message


def test_each_replica_gets_its_own_offset_and_the_harness_rows_keep_theirs(
    tmp_path: Path,
) -> None:
    b = cancel_storm(release_s=0.2, theta=0.0, replica="r0")
    cancel_storm(release_s=0.2, theta=3.0, replica="r1", b=b)
    b.event("replica_started", 5.0, "r1", seq=-1)  # the harness's row, on the client's clock
    run = load_run(b.write(tmp_path / "run"))
    before = run.server_events.copy()
    (note,) = [f for f in check_evidence(run).findings if f.check != "host_contention"]
    assert note.check == "clock_offset" and "replica r1's clock ran 2.995 s ahead" in note.message
    moved = run.server_events["t"] - before["t"]
    on_r1 = before["replica"].eq("r1") & before["seq"].ge(0)
    assert moved[on_r1].to_numpy() == pytest.approx(-3.0, abs=0.02)
    assert (moved[~on_r1] == 0).all()


def test_requests_that_never_heard_from_the_server_do_not_bound_it_from_below(
    judge: Judge,
) -> None:
    """Cancelled while the server had not read them yet: their `queued` comes after the
    cancel, which says nothing about the clocks; the offset is still corrected."""
    b = cancel_storm(release_s=0.2, theta=3.0)
    for i in range(20):
        b.request(f"q{i}", t=70 + i, outcome="cancelled", cancel_at=70.05 + i, http_status=None)
        b.event("queued", 70.2 + i + 3.0, request_id=f"q{i}")
    (note,) = clock_findings(judge(b))
    assert note.effect == Effect.NOTE and "ahead of" in note.message


@pytest.mark.parametrize(
    ("lo", "hi", "allowed", "expected"),
    [
        ([0.0, 0.5], [1.0, 2.0], 0, (0.5, 1.0)),  # agreeing intervals: their intersection
        ([0.0, 2.0], [1.0, 3.0], 0, None),  # disjoint: nothing agrees
        ([0.0, 0.1, 5.0], [1.0, 1.1, 6.0], 1, (0.1, 1.0)),  # one outvoted
        ([-np.inf, 0.2], [1.0, 0.4], 0, (0.2, 0.4)),  # one-sided intervals
        ([0.0, 1.0], [1.0, 2.0], 0, (1.0, 1.0)),  # closed: a shared end point agrees
    ],
)
def test_the_agreed_bound_is_what_most_intervals_share(
    lo: list[float], hi: list[float], allowed: int, expected: tuple[float, float] | None
) -> None:
    assert agreed_bound(np.array(lo), np.array(hi), allowed) == expected


def _sweep_bound(lo: np.ndarray, hi: np.ndarray, allowed: int) -> tuple[float, float] | None:
    """The agreed bound by a sweep over every end point in order (opening before closing
    at a tie), counting the intervals held after each: the formulation agreed_bound's
    sorted starts and ends replaced."""
    n = len(lo)
    points = np.concatenate([lo, hi])
    steps = np.concatenate([np.ones(n), -np.ones(n)])
    order = np.lexsort((-steps, points))
    points, steps = points[order], steps[order]
    inside = np.cumsum(steps)
    need = int(inside.max()) if n else 0
    if n - need > allowed or n == 0:
        return None
    opens = np.flatnonzero((steps > 0) & (inside == need))
    closes = np.flatnonzero((steps < 0) & (inside - steps == need))
    return float(points[opens[0]]), float(points[closes[-1]])


ENDS = st.sampled_from([-np.inf, -1.0, 0.0, 0.25, 0.5, 1.0, 2.0])


@given(st.lists(st.tuples(ENDS, ENDS), max_size=12), st.integers(0, 3))
def test_the_agreed_bound_is_the_sweeps(pairs: list[tuple[float, float]], allowed: int) -> None:
    intervals = [(a, b) for a, b in pairs if np.isfinite(b)]  # hi is a time, lo may be -inf
    lo = np.array([a for a, _ in intervals], dtype=float)
    hi = np.array([b for _, b in intervals], dtype=float)
    assert agreed_bound(lo, hi, allowed) == _sweep_bound(lo, hi, allowed)
