"""The load generator's loop (gates/evidence/checks_client.py): a loop that woke later than
its bound at p99 makes the run INVALID with findings that doubt timing; half the bound is a
note; a run without the measurement is not judged on it."""

from __future__ import annotations

from typing import Any

from gates.verdict import Status
from tests.gates.builder import RunBuilder
from tests.gates.evidence.conftest import Judge, clean, findings, messages


def lagged(p99_ms: float, bound_ms: float | None = 50.0) -> RunBuilder:
    """The clean run with its load generator's loop lag at `p99_ms`."""
    b = clean()
    generator: dict[str, Any] = {"mode": "local", "processes": 0}
    generator["loop_lag_ms"] = {"ticks": 6000, "p50": 1.0, "p99": p99_ms, "max": 3 * p99_ms}
    if bound_ms is not None:
        generator["loop_lag_bound_ms"] = bound_ms
    b.meta["load_generator"] = generator
    return b


def test_a_loop_that_kept_up_has_no_finding(check: Judge) -> None:
    verdict = check(lagged(p99_ms=4.0))
    assert verdict.status == Status.PASS
    assert messages(verdict, "loop_kept_up") == []


def test_a_loop_late_past_its_bound_is_invalid_and_doubts_timing(check: Judge) -> None:
    verdict = check(lagged(p99_ms=1200.0))
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "loop_kept_up")
    assert message.startswith("the load generator's event loop woke 1200 ms late at p99")
    assert "past its bound of 50 ms (samplers.loop_lag_bound_ms)" in message
    assert "OWN_GROUP" in message  # the way out names the scheduler groups
    [finding] = findings(verdict, "loop_kept_up")
    assert finding["effect"] == "invalid" and finding["doubts_timing"] is True


def test_over_half_the_bound_is_a_note_and_the_run_is_judged(check: Judge) -> None:
    verdict = check(lagged(p99_ms=30.0))
    assert verdict.status == Status.PASS
    [finding] = findings(verdict, "loop_kept_up")
    assert finding["effect"] == "note"
    assert "over half its bound of 50 ms" in finding["message"]


def test_the_runs_own_bound_decides(check: Judge) -> None:
    assert check(lagged(p99_ms=80.0, bound_ms=200.0)).status == Status.PASS
    assert check(lagged(p99_ms=80.0, bound_ms=20.0)).status == Status.INVALID


def test_a_run_that_kept_no_bound_is_held_to_kvgates_default(check: Judge) -> None:
    assert check(lagged(p99_ms=40.0, bound_ms=None)).status == Status.PASS
    assert check(lagged(p99_ms=60.0, bound_ms=None)).status == Status.INVALID


def test_a_run_without_the_measurement_is_not_judged_on_it(check: Judge) -> None:
    verdict = check(clean())
    assert findings(verdict, "loop_kept_up") == []
