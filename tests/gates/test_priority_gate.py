"""priority_under_pressure: critical questions sent while lower-priority work waits in the
server's queue must still get their first token in time (gates/metrics_priority.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from gates.metrics_priority import lower_waiting, waiting_spans
from gates.verdict import Status, Verdict
from tests.gates.builder import T0, RunBuilder, batch_waiting, critical
from tests.gates.conftest import gate

Judge = Callable[[RunBuilder], Verdict]


def test_fcfs_makes_critical_questions_wait_behind_queued_batch_work(judge: Judge) -> None:
    b = batch_waiting(RunBuilder(), 20.0, 60.0)
    critical(b, 21.0, 100, ttft=4.0)  # sent while the batch waited, and made to wait too
    critical(b, 70.0, 100, ttft=0.1)  # nothing waited then: not a test of priority
    result = gate(judge(b), "priority_under_pressure")
    assert result.status == Status.FAIL and result.n_samples == 100
    assert result.value == np.float64(4.0)
    assert any(
        "100 of 200 requests were sent while lower-priority work waited" in n for n in result.notes
    )


def test_priority_scheduling_lets_them_through(judge: Judge) -> None:
    b = batch_waiting(RunBuilder(), 20.0, 60.0)
    critical(b, 21.0, 100, ttft=0.2)
    result = gate(judge(b), "priority_under_pressure")
    assert result.status == Status.PASS and result.n_samples == 100


def test_without_anything_waiting_priority_was_never_put_to_the_test(judge: Judge) -> None:
    b = critical(RunBuilder(), 21.0, 100, ttft=4.0)
    b.event("admitted", 20.0, request_id="x", priority="batch")  # events, but no queue
    result = gate(judge(b), "priority_under_pressure")
    assert result.status == Status.INVALID and result.value is None
    assert "waited in the server's queue" in result.message


def test_a_critical_question_never_answered_is_a_breach_under_pressure(judge: Judge) -> None:
    b = batch_waiting(RunBuilder(), 20.0, 60.0)
    critical(b, 21.0, 90, ttft=0.2)
    for i in range(10):
        b.request(f"t{i}", t=22 + i * 0.1, priority="critical", ttft_s=None, outcome="timeout")
    result = gate(judge(b), "priority_under_pressure")
    assert result.status == Status.FAIL and result.censored == 10


def test_only_lower_priorities_waiting_count_and_preempted_work_waits_too() -> None:
    b = RunBuilder()
    b.event("queued", 10.0, request_id="i1", priority="interactive")
    b.event("admitted", 12.0, request_id="i1", priority="interactive")
    b.event("preempted", 20.0, request_id="b1", priority="batch")
    b.event("resumed", 25.0, request_id="b1", priority="batch")
    b.event("queued", 30.0, request_id="b2", priority="batch")  # still waiting at the end
    events = pd.DataFrame(b.rows["server_events"])
    spans = waiting_spans(events, t_end=T0 + 100)
    assert sorted(spans["request_id"]) == ["b1", "b2", "i1"]
    t = np.array([T0 + 11, T0 + 11, T0 + 22, T0 + 26, T0 + 31])
    prio = np.array(["critical", "interactive", "critical", "critical", "interactive"])
    # i1 (interactive) is lower than critical but not than interactive; b1 waits while
    # preempted (20-25 s); b2 from 30 s to the end
    assert lower_waiting(spans, t, prio).tolist() == [1, 0, 1, 0, 1]
