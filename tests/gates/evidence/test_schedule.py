"""A replay's schedule (gates/evidence/checks_schedule.py): requests that went out later
than the bound, or never, make the run INVALID; punctual ones leave no finding."""

from __future__ import annotations

from gates.verdict import Status
from tests.gates.builder import RunBuilder
from tests.gates.evidence.conftest import Judge, clean, findings, messages


def replayed(late_ms: float, bound_ms: float = 5.0, unsent: int = 0) -> RunBuilder:
    """The clean run as a replay: every request planned `late_ms` before it went out."""
    b = clean()
    for row in b.rows["requests"]:
        row["t_scheduled"] = row["t_send"] - late_ms / 1000.0
    n = len(b.rows["requests"])
    b.meta["replay"] = {"scheduled": n + unsent, "unsent": unsent}
    b.meta["replay"]["schedule_error_bound_ms"] = bound_ms
    return b


def test_a_punctual_replay_has_no_finding(check: Judge) -> None:
    verdict = check(replayed(late_ms=1.0))
    assert verdict.status == Status.PASS
    assert messages(verdict, "schedule_kept") == []


def test_a_replay_late_past_its_bound_is_invalid_and_doubts_timing(check: Judge) -> None:
    verdict = check(replayed(late_ms=12.0))
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "schedule_kept")
    assert message.startswith("the replay's requests went out 12.0 ms late at p99")
    assert "past its bound of 5 ms (samplers.schedule_error_bound_ms)" in message
    [finding] = findings(verdict, "schedule_kept")
    assert finding["doubts_timing"] is True


def test_the_runs_own_bound_decides(check: Judge) -> None:
    assert check(replayed(late_ms=12.0, bound_ms=20.0)).status == Status.PASS


def test_requests_never_sent_make_the_run_invalid(check: Judge) -> None:
    verdict = check(replayed(late_ms=1.0, unsent=3))
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "schedule_kept")
    assert message.startswith("3 of the replay's 103 planned requests were never sent")


def test_a_run_without_a_replay_is_not_judged_on_it(check: Judge) -> None:
    verdict = check(clean())
    assert messages(verdict, "schedule_kept") == []


def test_a_run_that_kept_no_bound_is_held_to_kvgates_default(check: Judge) -> None:
    for late_ms, status in ((12.0, Status.PASS), (30.0, Status.INVALID)):
        b = replayed(late_ms=late_ms)
        del b.meta["replay"]["schedule_error_bound_ms"]
        assert check(b).status == status
