"""Which faults-table rows the gates count as a replica's death, a process fault or a
connection break: by each row's declared `effect`, never by its kind; and rows written before
that column existed, read as kvgate read their kinds then (gates/legacy.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contract import FaultEffect
from gates.rundir import RunDirError, load_run
from gates.verdict import Status, Verdict
from gates.windows import connection_breaks, process_faults, replica_deaths
from tests.gates.builder import T0, RunBuilder
from tests.gates.conftest import gate

Judge = Callable[[RunBuilder], Verdict]


def every_kind() -> RunBuilder:
    """One row of each kind, as written before the `effect` column existed."""
    b = RunBuilder()
    b.fault(10, target="r0", kind="kill", params={"replica": "r0"})
    b.fault(12, target="r1", kind="pause", t_end=14)
    b.fault(20, target="r0", kind="signal", params={"signal": "KILL"})
    b.fault(22, target="r1", kind="signal", params={"signal": "TERM"})
    b.fault(24, target="r1", kind="signal", params={"signal": "STOP"}, t_end=26)
    b.fault(28, target="r1", kind="signal", params={"signal": "HUP"})
    b.fault(30, target="r0", kind="command", params={"exit_code": 0})
    b.fault(32, target="r1", kind="command", params={"exit_code": 1})
    b.fault(34, target="r1", kind="command", params={"exit_code": None})  # timed out
    net = {"toxic": {"type": "reset_peer", "attributes": {}}}
    b.fault(40, target="proxy", kind="network", t_end=45, params=net)
    b.fault(50, target="proxy", kind="network", params={"toxic": {"type": "timeout"}})
    b.fault(60, target="proxy", kind="network", t_end=65, params={"toxic": {"type": "latency"}})
    return b


def test_old_runs_read_kills_fatal_signals_and_commands_that_succeeded_as_deaths(
    tmp_path: Path,
) -> None:
    run = load_run(every_kind().write(tmp_path / "run"))
    deaths = replica_deaths(run.faults)
    assert list(zip(deaths["kind"], deaths["t_start"] - T0, strict=True)) == [
        ("kill", 10),
        ("signal", 20),
        ("signal", 22),
        ("command", 30),
    ]
    acted = process_faults(run.faults)
    assert set(acted["kind"]) == {"kill", "pause", "signal", "command"}
    assert len(acted) == 9  # all but the three network faults
    assert list(run.faults["effect"]) == [
        "kills",
        "pauses",
        "kills",
        "kills",
        "pauses",
        "none",
        "kills",
        "none",
        "none",
        "breaks_connections",
        "breaks_connections",
        "degrades_network",
    ]


def test_old_runs_read_breaking_toxics_as_connection_breaks_open_ones_until_the_end(
    tmp_path: Path,
) -> None:
    run = load_run(every_kind().write(tmp_path / "run"))
    assert connection_breaks(run.faults, run.t_end) == [(T0 + 40, T0 + 45), (T0 + 50, run.t_end)]


def test_the_gates_read_the_declared_effect_not_the_kind(tmp_path: Path) -> None:
    """Rows whose kind says one thing and whose effect another: the effect decides."""
    b = RunBuilder()
    b.fault(10, target="r0", kind="command", params={"exit_code": 0}, effect="none")
    b.fault(20, target="r1", kind="command", params={"exit_code": 0}, effect="kills")
    b.fault(30, target="r0", kind="kill", effect="none")  # its apply did not complete
    b.fault(40, target="r1", kind="signal", params={"signal": "KILL"}, effect="pauses")
    b.fault(50, target="r0", kind="command", t_end=55, effect="breaks_connections")
    b.fault(60, target="proxy", kind="network", t_end=65, effect="degrades_network")
    b.fault(70, target="r1", kind="made_up", effect="kills")  # a kind the gates never heard of
    run = load_run(b.write(tmp_path / "run"))
    deaths = replica_deaths(run.faults)
    assert list(zip(deaths["kind"], deaths["t_start"] - T0, strict=True)) == [
        ("command", 20),
        ("made_up", 70),
    ]
    assert connection_breaks(run.faults, run.t_end) == [(T0 + 50, T0 + 55)]
    assert list(process_faults(run.faults)["t_start"] - T0) == [10, 20, 30, 40, 70]


def test_an_effect_the_contract_does_not_name_is_refused(tmp_path: Path) -> None:
    path = RunBuilder().fault(10, kind="command", effect="explodes").write(tmp_path / "run")
    with pytest.raises(RunDirError) as err:
        load_run(path)
    allowed = ", ".join(FaultEffect)
    assert f"table 'faults', row 1: effect 'explodes' is not one of {allowed}" in str(err.value)


def test_unreadable_params_count_as_no_signal(tmp_path: Path) -> None:
    b = RunBuilder().fault(20, kind="signal")
    b.rows["faults"][0]["params"] = "not json"
    assert replica_deaths(load_run(b.write(tmp_path / "run")).faults).empty


def double_hold(b: RunBuilder) -> RunBuilder:
    """Request m admitted on r0, then on r1 after r0's fault at 40 s, never released on r0."""
    b.event("admitted", 30, replica="r0", request_id="m")
    return b.event("admitted", 41, replica="r1", request_id="m")


def test_failover_gate_judges_an_old_runs_fatal_signal_or_command_as_a_kill(judge: Judge) -> None:
    # the signalled process was r2, not r0: m's hold on r0 never ended, so it was held twice
    by_signal = double_hold(RunBuilder().fault(40, "r2", "signal", params={"signal": "KILL"}))
    result = gate(judge(by_signal), "failover_no_double_reservation")
    assert result.status == Status.FAIL and result.evidence[0]["request_id"] == "m"
    by_command = double_hold(RunBuilder().fault(40, "r2", "command", params={"exit_code": 0}))
    assert gate(judge(by_command), "failover_no_double_reservation").status == Status.FAIL


def cancelled_on_r1_then(effect: str) -> RunBuilder:
    """400 requests cancelled on r1 at +30 s and never released there, and a fault on r1 at
    +30.5 s (a command that exited 0)."""
    b = RunBuilder().fault(30.5, "r1", "command", params={"exit_code": 0}, effect=effect)
    for i in range(400):
        rid = f"k{i}"
        b.request(rid, t=29, traffic_class="cancel_storm", outcome="cancelled", cancel_at=30.0)
        b.event("admitted", 29.1, replica="r1", request_id=rid, tenant="acme", blocks=4)
    return b


def test_a_command_that_kills_nothing_does_not_free_a_leak(judge: Judge) -> None:
    """A disk-full or throttle command exits 0 on r1: r1 lives on, so cancellations it never
    released are leaks, not reservations freed by a death."""
    result = gate(judge(cancelled_on_r1_then("none")), "cancel_release_p99")
    assert result.status == Status.FAIL and result.censored == 400
    assert not any("freed by a replica's death" in n for n in result.notes)


def test_a_command_that_declares_it_kills_frees_what_the_replica_held(judge: Judge) -> None:
    result = gate(judge(cancelled_on_r1_then("kills")), "cancel_release_p99")
    assert result.status == Status.PASS and result.censored == 0
    assert result.value == pytest.approx(0.5)
    assert any("freed by a replica's death" in n for n in result.notes)


def test_failover_gate_counts_only_a_command_that_declares_it_kills(judge: Judge) -> None:
    for effect, status in (("kills", Status.FAIL), ("none", Status.INVALID)):
        b = double_hold(
            RunBuilder().fault(40, "r2", "command", params={"exit_code": 0}, effect=effect)
        )
        assert gate(judge(b), "failover_no_double_reservation").status == status, effect


def test_failover_gate_has_no_data_without_a_death(judge: Judge) -> None:
    for kind, params in (
        ("signal", {"signal": "STOP"}),
        ("command", {"exit_code": 2}),
        ("network", {"toxic": {"type": "reset_peer"}}),
    ):
        b = double_hold(RunBuilder().fault(40, "r0", kind, params=params))
        result = gate(judge(b), "failover_no_double_reservation")
        assert result.status == Status.INVALID, kind
        assert "no replica was killed" in result.message


def refused_and_broken(outcome: str, n_broken: int = 20) -> RunBuilder:
    """400 batch requests refused with 503 + Retry-After, and `n_broken` sent at 20 s whose
    connection broke (`outcome`, no HTTP status) 1 s later."""
    b = RunBuilder()
    ending: dict[str, Any] = {"outcome": "rejected", "http_status": 503, "retry_after_s": 1}
    for i in range(400):
        b.request(f"b{i}", priority="batch", traffic_class="batch", **ending)
    for i in range(n_broken):
        b.request(
            f"k{i}",
            t=20.0,
            priority="batch",
            traffic_class="batch",
            outcome=outcome,
            http_status=None,
            e2e_s=1.0,
        )
    return b


def test_requests_broken_by_a_reset_toxic_are_not_judged_as_the_servers(judge: Judge) -> None:
    reset = {"toxic": {"type": "reset_peer"}}
    for outcome in ("disconnected", "timeout", "error"):
        b = refused_and_broken(outcome).fault(19, "proxy", "network", t_end=25, params=reset)
        result = gate(judge(b), "low_priority_explicit_errors")
        assert result.status == Status.PASS and result.n_samples == 400, outcome
        assert any("20 requests cut short" in n for n in result.notes)


def test_a_slowing_toxic_or_a_break_elsewhere_excuses_nothing(judge: Judge) -> None:
    latency = {"toxic": {"type": "latency"}}
    slowed = refused_and_broken("timeout").fault(19, "proxy", "network", t_end=25, params=latency)
    assert gate(judge(slowed), "low_priority_explicit_errors").status == Status.FAIL
    reset = {"toxic": {"type": "reset_peer"}}
    later = refused_and_broken("timeout").fault(40, "proxy", "network", t_end=45, params=reset)
    assert gate(judge(later), "low_priority_explicit_errors").status == Status.FAIL
    answered = refused_and_broken("timeout").fault(19, "proxy", "network", t_end=25, params=reset)
    for row in answered.rows["requests"][-20:]:
        row |= {"outcome": "error", "http_status": 500}  # the server's answer, not a break
    assert gate(judge(answered), "low_priority_explicit_errors").status == Status.FAIL


def test_replica_failed_is_excused_by_a_stop_signal_not_by_a_network_fault(judge: Judge) -> None:
    def replica_failed() -> RunBuilder:
        b = refused_and_broken("error", n_broken=0)
        for i in range(20):
            b.request(
                f"k{i}",
                priority="batch",
                traffic_class="batch",
                outcome="error",
                http_status=200,
                error_code="replica_failed",
                replica="r1",
                e2e_s=1.0,
            )
        return b

    stopped = replica_failed().fault(20.5, "r1", "signal", t_end=22, params={"signal": "STOP"})
    assert gate(judge(stopped), "low_priority_explicit_errors").status == Status.PASS
    reset = {"toxic": {"type": "reset_peer"}}
    proxied = replica_failed().fault(20.5, "r1", "network", t_end=22, params=reset)
    assert gate(judge(proxied), "low_priority_explicit_errors").status == Status.FAIL
