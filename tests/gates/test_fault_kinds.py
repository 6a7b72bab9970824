"""Which faults-table rows the gates count as a replica's death, a process fault or a
connection break: the replica kinds, and the signal, command and network kinds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gates.rundir import load_run
from gates.verdict import Status, Verdict
from gates.windows import connection_breaks, process_faults, replica_deaths
from tests.gates.builder import T0, RunBuilder
from tests.gates.conftest import gate

Judge = Callable[[RunBuilder], Verdict]


def every_kind() -> RunBuilder:
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


def test_deaths_are_kills_fatal_signals_and_commands_that_succeeded(tmp_path: Path) -> None:
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


def test_connection_breaks_are_breaking_toxics_open_ones_until_the_end(tmp_path: Path) -> None:
    run = load_run(every_kind().write(tmp_path / "run"))
    assert connection_breaks(run.faults, run.t_end) == [(T0 + 40, T0 + 45), (T0 + 50, run.t_end)]


def test_unreadable_params_count_as_no_signal(tmp_path: Path) -> None:
    b = RunBuilder().fault(20, kind="signal")
    b.rows["faults"][0]["params"] = "not json"
    assert replica_deaths(load_run(b.write(tmp_path / "run")).faults).empty


def double_hold(b: RunBuilder) -> RunBuilder:
    """Request m admitted on r0, then on r1 after r0's fault at 40 s, never released on r0."""
    b.event("admitted", 30, replica="r0", request_id="m")
    return b.event("admitted", 41, replica="r1", request_id="m")


def test_failover_gate_judges_a_fatal_signal_or_a_command_as_a_kill(judge: Judge) -> None:
    # the signalled process was r2, not r0: m's hold on r0 never ended, so it was held twice
    by_signal = double_hold(RunBuilder().fault(40, "r2", "signal", params={"signal": "KILL"}))
    result = gate(judge(by_signal), "failover_no_double_reservation")
    assert result.status == Status.FAIL and result.evidence[0]["request_id"] == "m"
    by_command = double_hold(RunBuilder().fault(40, "r2", "command", params={"exit_code": 0}))
    assert gate(judge(by_command), "failover_no_double_reservation").status == Status.FAIL


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
