"""Host contention (gates/evidence/checks_host.py): a correct server starved by other
processes on its host is not a failing one; a breach no timing can fake still fails it."""

from __future__ import annotations

from gates.verdict import Status
from tests.gates.builder import RunBuilder, host_cpu
from tests.gates.conftest import gate
from tests.gates.evidence.conftest import Judge, clean, findings, messages


def slow(ttft: float = 1.5) -> RunBuilder:
    """The evidence conftest's clean run, with every first token `ttft` s late: past the 1 s
    line of its TTFT gate, as a correct server's is beside a busy neighbour."""
    b = clean()
    for row in b.rows["requests"]:
        row |= {"ttft_s": ttft, "e2e_s": ttft + 0.2}
    return b


def busy(t: float) -> float:
    return 1.1  # of the host's 2 CPUs, all along


def quiet(t: float) -> float:
    return 0.05


def test_a_ttft_fail_beside_a_busy_neighbour_reads_invalid_not_fail(check: Judge) -> None:
    assert check(slow()).status == Status.FAIL  # without the host's samples: a FAIL
    verdict = check(host_cpu(slow(), busy))
    assert gate(verdict, "ttft_p95").status == Status.FAIL  # the gate still says what it saw
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "host_contention")
    assert message.startswith(
        "other processes on this host used 1.1 of its 2 CPUs on average during the load "
        "(55%; worst 10 s: 1.1, 55%): the server's and the client's timings are not this "
        "system's; rerun on a quiet host"
    )
    [finding] = findings(verdict, "host_contention")
    assert finding["effect"] == "invalid" and finding["doubts_timing"] is True


def test_an_oom_in_the_same_run_still_fails_it(check: Judge) -> None:
    b = host_cpu(slow(), busy).event("oom", 50, request_id=None)
    verdict = check(b)
    assert gate(verdict, "no_oom").status == Status.FAIL
    assert verdict.status == Status.FAIL


def test_first_tokens_that_never_came_still_fail_it(check: Judge) -> None:
    """A busy host makes answers late; it does not make them vanish (+inf)."""
    b = host_cpu(clean(), busy)
    for row in b.rows["requests"][:20]:
        row |= {"outcome": "timeout", "ttft_s": None, "e2e_s": 30.0, "chunks": 0}
    verdict = check(b)
    assert gate(verdict, "ttft_p95").value == float("inf")
    assert verdict.status == Status.FAIL


def test_a_quiet_host_leaves_the_run_untouched(check: Judge) -> None:
    verdict = check(host_cpu(clean(), quiet))
    assert verdict.status == Status.PASS
    assert messages(verdict, "host_contention") == []
    assert {"name": "host_contention", "clean": True}.items() <= next(
        c for c in verdict.evidence["checks"] if c["name"] == "host_contention"
    ).items()


def test_ten_seconds_of_a_neighbour_on_the_whole_host_are_enough(check: Judge) -> None:
    """A mean of 0.2 cores, far within its bound, but 1.9 of 2 cores from +40 s to +50 s:
    more than the slowest 1% of the requests can fall in that burst."""
    verdict = check(host_cpu(slow(), lambda t: 1.9 if 40 < t <= 50 else 0.0))
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "host_contention")
    assert "used 0.21 of its 2 CPUs on average" in message
    assert "worst 10 s: 1.9, 95%" in message


def test_a_noticeable_neighbour_below_the_bounds_is_a_note(check: Judge) -> None:
    verdict = check(host_cpu(clean(), lambda t: 0.3))
    assert verdict.status == Status.PASS
    [note] = messages(verdict, "host_contention")
    assert "used 0.30 of its 2 CPUs on average" in note and "so the run was judged" in note


def test_stolen_time_is_foreign_and_said(check: Judge) -> None:
    verdict = check(host_cpu(slow(), lambda t: 1.2, steal=0.8))
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "host_contention")
    assert "0.80 of them stolen by the hypervisor" in message


def test_the_run_is_judged_by_its_own_bounds(check: Judge) -> None:
    """A plan that allows other processes 75% of the host on average and all of it in any
    10 s: meta.json keeps those, and judging the run again reads them."""
    b = host_cpu(slow(), busy)
    b.meta |= {"foreign_cpu_bound_share": 0.75, "foreign_cpu_window_bound_share": 1.0}
    verdict = check(b)
    assert verdict.status == Status.FAIL
    [note] = messages(verdict, "host_contention")
    assert "the bounds (75% of its CPUs on average and 100% in any 10 s, as" in note


def test_only_the_load_is_judged(check: Judge) -> None:
    """A neighbour that ran before the load began (the stress window is +10 s to +100 s)."""
    verdict = check(host_cpu(clean(), lambda t: 2.0 if t <= 10 else 0.0))
    assert verdict.status == Status.PASS and messages(verdict, "host_contention") == []


def test_a_run_recorded_before_the_host_was_sampled_gets_a_note_not_invalid(
    check: Judge,
) -> None:
    verdict = check(slow())
    assert verdict.status == Status.FAIL
    [note] = messages(verdict, "host_contention")
    assert note.startswith("the CPU other processes used on this host during the load was not ")
    assert "a run recorded before kvgate sampled its host's CPU" in note


def test_a_target_that_could_not_be_found_is_said_and_not_guessed(check: Judge) -> None:
    b = host_cpu(clean(), busy, span=(0, 5))  # the target lost from +5 s on
    for second in range(6, 121):
        b.sample(
            "kvgate_host_cpu_unmeasured",
            1.0,
            second,
            target="host",
            labels="reason=no process this user may see listens on port 8000",
            source="host",
        )
    verdict = check(b)
    assert verdict.status == Status.PASS
    [note] = messages(verdict, "host_contention")
    assert "was not measured (no process this user may see listens on port 8000)" in note
