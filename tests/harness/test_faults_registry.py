"""The fault registry: each kind's plan validation, and the signal, command and network kinds
against throwaway processes, shell commands, a fake proxy client and the real proxy."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import gevent
import psutil
import pytest
from pydantic import TypeAdapter

import contract
import harness.netproxy.client
from contract import FaultEffect
from gates import schema
from gates.rundir import load_run, read_jsonl
from harness.faults.base import KINDS, FaultError, FaultSpec, fault_kind
from harness.faults.kinds.command import CommandFault
from harness.faults.kinds.network import NetworkFault
from harness.faults.kinds.signal import SignalFault
from harness.faults.proxy import start_proxy_in_path
from harness.faults.registry import ACTIONS, FAULT_MODELS, REGISTRY, Fault
from harness.faults.scheduler import FaultScheduler
from harness.plan import PlanError, load_plan, plan_from_dict
from harness.rundir import TableWriter
from tests.waiting import wait_until

PLANS = Path(__file__).resolve().parents[2] / "harness" / "plans"
WAIT_S = 10.0  # for what takes milliseconds: a process's exit, a local HTTP answer
ADAPTER: TypeAdapter[FaultSpec] = TypeAdapter(Fault)

BASE = """
name: t
target: {type: reference, replicas: 2}
traffic:
  classes:
    short_qa_critical: {weight: 1}
load: {users: 2, duration_s: 60}
"""
EXTERNAL = "target={type: external, url: 'http://127.0.0.1:9'}"


def plan_with(tmp_path: Path, faults: str, overrides: list[str] | None = None) -> Any:
    path = tmp_path / "plan.yaml"
    path.write_text(BASE + "faults:\n" + faults)
    return load_plan(path, overrides)


def problems(tmp_path: Path, faults: str, overrides: list[str] | None = None) -> str:
    with pytest.raises(PlanError) as err:
        plan_with(tmp_path, faults, overrides)
    return str(err.value)


# -- the registry and the plan -------------------------------------------------------------


SHIPPED_KINDS = {"kill", "pause", "kill_during_storm", "signal", "command", "network"}


def test_every_shipped_kind_registered_itself_with_a_model_and_an_action() -> None:
    assert set(REGISTRY) == set(FAULT_MODELS) == set(ACTIONS) == SHIPPED_KINDS
    for name, kind in REGISTRY.items():
        assert kind.name == name == kind.spec.model_fields["kind"].default
        assert kind.spec.__module__.startswith("harness.faults.kinds.")


def test_a_kind_must_say_what_it_does_and_take_a_name_of_its_own() -> None:
    class Silent(FaultSpec):
        kind: Literal["silent"] = "silent"

    with pytest.raises(TypeError, match=r"Silent: say what the fault does: define declared_"):
        fault_kind(Silent)  # type: ignore[type-abstract]  # the mistake this test makes on purpose

    class Nameless(FaultSpec):
        def declared_effect(self) -> FaultEffect:
            return FaultEffect.NONE

    with pytest.raises(TypeError, match=r"Nameless: give the model `kind: Literal"):
        fault_kind(Nameless)

    class Twin(FaultSpec):
        kind: Literal["kill"] = "kill"

        def declared_effect(self) -> FaultEffect:
            return FaultEffect.NONE

    with pytest.raises(TypeError, match=r"fault kind 'kill' is registered twice: by harness"):
        fault_kind(Twin)(object)
    assert REGISTRY["kill"].spec.__module__ == "harness.faults.kinds.replica"
    assert set(KINDS) == SHIPPED_KINDS


@pytest.mark.parametrize(
    ("entry", "effect"),
    [
        ({"kind": "kill"}, FaultEffect.KILLS),
        ({"kind": "kill_during_storm"}, FaultEffect.KILLS),
        ({"kind": "pause"}, FaultEffect.PAUSES),
        ({"kind": "signal", "signal": "KILL", "pid": 42}, FaultEffect.KILLS),
        ({"kind": "signal", "signal": "SIGTERM", "pid": 42}, FaultEffect.KILLS),
        ({"kind": "signal", "signal": "STOP", "pid": 42}, FaultEffect.PAUSES),
        ({"kind": "signal", "signal": "CONT", "pid": 42}, FaultEffect.NONE),
        ({"kind": "signal", "signal": "INT", "pid": 42}, FaultEffect.NONE),
        ({"kind": "signal", "signal": "HUP", "pid": 42}, FaultEffect.NONE),
        ({"kind": "command", "command": "fallocate -l 50G /data/fill"}, FaultEffect.NONE),
        ({"kind": "command", "command": "docker kill v", "effect": "kills"}, FaultEffect.KILLS),
        (
            {"kind": "network", "duration_s": 1, "toxic": {"type": "reset_peer"}},
            FaultEffect.BREAKS_CONNECTIONS,
        ),
        (
            {"kind": "network", "duration_s": 1, "toxic": {"type": "timeout"}},
            FaultEffect.BREAKS_CONNECTIONS,
        ),
        (
            {"kind": "network", "duration_s": 1, "toxic": {"type": "slow_close"}},
            FaultEffect.DEGRADES_NETWORK,
        ),
    ],
)
def test_each_kind_declares_what_it_does(entry: dict[str, Any], effect: FaultEffect) -> None:
    assert spec(at_s=0, **entry).declared_effect() == effect


def test_the_toxics_the_plan_accepts_are_the_proxys() -> None:
    from harness.netproxy.toxics import TOXIC_TYPES

    for name, attributes in contract.TOXIC_ATTRIBUTES.items():
        assert set(TOXIC_TYPES[name].ATTRIBUTES) == set(attributes)


@pytest.mark.parametrize("name", ["smoke", "ci", "soak", "qualify-quick"])
def test_shipped_plans_keep_their_replica_faults(name: str) -> None:
    plan = load_plan(PLANS / f"{name}.yaml")
    assert plan.faults and all(f.admin_replica() is not None for f in plan.faults)
    # a dumped plan (plan.json, which local workers read) validates to the same plan
    again = plan_from_dict({**json.loads(plan.model_dump_json()), "base_dir": plan.base_dir})
    assert again.faults == plan.faults


def test_replica_faults_mean_what_they_meant(tmp_path: Path) -> None:
    plan = plan_with(
        tmp_path,
        "  - {kind: kill, at_s: 5, replica: r1}\n"
        "  - {kind: pause, at_s: 6}\n"
        "  - {kind: kill_during_storm, at_s: 7, min_cancels: 4}\n",
    )
    kill, pause, storm = plan.faults
    assert (kill.replica, kill.restart_after_s) == ("r1", 5.0)
    assert (pause.replica, pause.duration_s) == ("r0", 2.0)
    assert (storm.storm_wait_s, storm.min_cancels, storm.restart_after_s) == (20.0, 4, 5.0)


def test_each_kind_has_only_its_own_fields(tmp_path: Path) -> None:
    text = problems(tmp_path, "  - {kind: kill, at_s: 5, duration_s: 3}\n")
    assert (
        "faults.0.duration_s: unknown key; allowed keys: at_s, kind, replica, restart_after_s "
        "(got 3)" in text
    )
    text = problems(tmp_path, "  - {kind: command, at_s: 5, command: 'true', signal: KILL}\n")
    assert (
        "faults.0.signal: unknown key; allowed keys: at_s, kind, command, rollback, "
        "rollback_after_s, timeout_s, target, effect (got 'KILL')" in text
    )


def test_unknown_or_missing_kind_lists_the_kinds(tmp_path: Path) -> None:
    kinds = "command, kill, kill_during_storm, network, pause, signal"
    text = problems(tmp_path, "  - {kind: explode, at_s: 5}\n")
    assert f"faults.0: a fault's kind is one of {kinds} (got 'explode')" in text
    text = problems(tmp_path, "  - {at_s: 5}\n")
    assert f"faults.0: a fault's kind is one of {kinds} (got None)" in text


def test_signal_faults_validate(tmp_path: Path) -> None:
    plan = plan_with(
        tmp_path,
        "  - {kind: signal, at_s: 5, signal: SIGTERM, match: 'vllm serve',\n"
        "     restart_command: 'systemctl start vllm', wait_healthy_url: 'http://h:8000/health'}\n"
        "  - {kind: signal, at_s: 6, signal: stop, pidfile: /run/vllm.pid}\n"
        "  - {kind: signal, at_s: 7, signal: KILL, pid: 4242}\n",
        [EXTERNAL],
    )
    term, stop, kill = plan.faults
    assert isinstance(term, SignalFault) and term.signal == "TERM"
    assert (term.restart_after_s, term.timeout_s, term.healthy_timeout_s) == (5.0, 60.0, 120.0)
    assert stop.signal == "STOP" and stop.duration_s == 2.0 and stop.restart_command is None
    assert kill.pid == 4242 and kill.restart_after_s is None  # no restart: no rollback


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("{signal: KILL}", "give exactly one of pid, pidfile or match (the process to signal)"),
        ("{signal: KILL, pid: 42, match: x}", "(the process to signal); got pid, match"),
        ("{signal: QUIT, pid: 42}", "faults.0.signal: Input should be 'KILL', 'TERM', 'STOP'"),
        ("{signal: STOP, pid: 42, restart_command: x}", "a STOP is rolled back by CONT"),
        ("{signal: KILL, pid: 42, duration_s: 3}", "duration_s applies to STOP only"),
        ("{signal: TERM, pid: 42, restart_after_s: 3}", "restart_after_s: need a restart_command"),
        ("{signal: TERM, pid: 42, wait_healthy_url: 'http://h'}", "need a restart_command"),
        ("{signal: TERM, pid: 42, restart_command: x, wait_healthy_url: h}", "must start with"),
    ],
)
def test_bad_signal_faults_say_what_to_fix(tmp_path: Path, fault: str, message: str) -> None:
    text = problems(tmp_path, "  - {kind: signal, at_s: 5, " + fault[1:] + "\n")
    assert message in text


def test_command_faults_validate(tmp_path: Path) -> None:
    plan = plan_with(
        tmp_path,
        "  - {kind: command, at_s: 5, command: 'docker kill vllm', rollback: 'docker start vllm',\n"
        "     rollback_after_s: 10, target: r0}\n"
        "  - {kind: command, at_s: 6, command: 'kubectl delete pod -l app=vllm'}\n",
        [EXTERNAL],
    )
    docker, kubectl = plan.faults
    assert isinstance(docker, CommandFault) and docker.rollback_after_s == 10
    assert (kubectl.rollback, kubectl.rollback_after_s, kubectl.timeout_s) == (None, None, 30.0)
    text = problems(tmp_path, "  - {kind: command, at_s: 5, command: x, rollback_after_s: 3}\n")
    assert "faults.0: rollback_after_s needs a rollback command" in text
    assert "faults.0.command: Field required" in problems(
        tmp_path, "  - {kind: command, at_s: 1}\n"
    )


def test_a_command_says_what_it_does_and_does_nothing_by_default(tmp_path: Path) -> None:
    plan = plan_with(
        tmp_path,
        "  - {kind: command, at_s: 5, command: 'fallocate -l 50G /data/fill', target: r0}\n"
        "  - {kind: command, at_s: 6, command: 'docker kill vllm-0', effect: kills}\n",
        [EXTERNAL],
    )
    fill, kill = plan.faults
    assert isinstance(fill, CommandFault) and fill.effect == FaultEffect.NONE
    assert isinstance(kill, CommandFault) and kill.effect == FaultEffect.KILLS
    again = plan_from_dict({**json.loads(plan.model_dump_json()), "base_dir": plan.base_dir})
    assert again.faults == plan.faults
    text = problems(tmp_path, "  - {kind: command, at_s: 5, command: x, effect: kill}\n")
    assert (
        "faults.0.effect: Input should be 'kills', 'pauses', 'breaks_connections', "
        "'degrades_network' or 'none' (got 'kill')" in text
    )


def test_network_faults_validate(tmp_path: Path) -> None:
    plan = plan_with(
        tmp_path,
        "  - {kind: network, at_s: 5, duration_s: 10,\n"
        "     toxic: {type: latency, attributes: {latency: 300, jitter: 50}}}\n"
        "  - {kind: network, at_s: 6, duration_s: 2,\n"
        "     toxic: {type: reset_peer, stream: upstream, toxicity: 0.5}}\n",
    )
    slow, reset = plan.faults
    assert isinstance(slow, NetworkFault) and slow.toxic.attributes == {
        "latency": 300,
        "jitter": 50,
    }
    assert (reset.toxic.stream, reset.toxic.toxicity) == ("upstream", 0.5)
    bad = "  - {kind: network, at_s: 5, duration_s: 10, toxic: {type: latency, attributes: "
    text = problems(tmp_path, bad + "{latency: 3, delay: 5}}}\n")
    assert "faults.0.toxic: latency: unknown attribute(s) delay; allowed: latency, jitter" in text
    assert "give attributes.rate (> 0)" in problems(
        tmp_path, "  - {kind: network, at_s: 5, duration_s: 1, toxic: {type: bandwidth}}\n"
    )
    text = problems(tmp_path, "  - {kind: network, at_s: 5, duration_s: 1, toxic: {type: dns}}\n")
    assert "faults.0.toxic.type: Input should be 'latency', 'bandwidth', 'reset_peer'" in text
    assert "faults.0.duration_s: Field required" in problems(
        tmp_path, "  - {kind: network, at_s: 5, toxic: {type: timeout}}\n"
    )


def test_a_dumped_plan_with_every_kind_validates_again(tmp_path: Path) -> None:
    """plan.json, which local workers read, holds the defaults the validators filled in."""
    plan = plan_with(
        tmp_path,
        "  - {kind: kill, at_s: 1}\n"
        "  - {kind: signal, at_s: 2, signal: STOP, pid: 42}\n"
        "  - {kind: signal, at_s: 3, signal: TERM, match: x, restart_command: y,\n"
        "     wait_healthy_url: 'http://h/health'}\n"
        "  - {kind: command, at_s: 4, command: x, rollback: y}\n"
        "  - {kind: network, at_s: 5, duration_s: 1, toxic: {type: timeout}}\n",
    )
    again = plan_from_dict({**json.loads(plan.model_dump_json()), "base_dir": plan.base_dir})
    assert again.faults == plan.faults


def test_replica_kinds_are_refused_on_an_external_target_naming_the_others(
    tmp_path: Path,
) -> None:
    text = problems(tmp_path, "  - {kind: pause, at_s: 5}\n", [EXTERNAL])
    assert "faults.0 (pause at 5.0s): pause faults need a target kvgate runs" in text
    assert "use a command, network or signal fault" in text


def test_network_faults_need_plain_http(tmp_path: Path) -> None:
    text = problems(
        tmp_path,
        "  - {kind: network, at_s: 5, duration_s: 1, toxic: {type: timeout}}\n",
        ["target={type: external, url: 'https://api.example.com'}"],
    )
    assert "network faults need an http:// target" in text


def test_every_fault_fires_before_the_end_of_the_load(tmp_path: Path) -> None:
    text = problems(tmp_path, "  - {kind: command, at_s: 60, command: 'true'}\n")
    assert "faults.0 (command at 60.0s) is not before the end of the load (60.0s)" in text


# -- running faults ------------------------------------------------------------------------


class FakeProxy:
    """Stands in for harness.netproxy.client.ProxyClient; can be told to fail."""

    def __init__(self, fail_add: bool = False, fail_remove: bool = False) -> None:
        self.toxics: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_add = fail_add
        self.fail_remove = fail_remove

    def add_toxic(
        self,
        name: str,
        type: str,
        attributes: dict[str, float],
        stream: str = "downstream",
        toxicity: float = 1.0,
    ) -> None:
        self.calls.append(("add", name))
        if self.fail_add:
            raise RuntimeError("netproxy POST /toxics: 400 bad toxic")
        self.toxics[name] = {"type": type, "attributes": attributes, "stream": stream}
        self.toxics[name]["toxicity"] = toxicity

    def remove_toxic(self, name: str) -> None:
        self.calls.append(("remove", name))
        if self.fail_remove or name not in self.toxics:
            raise RuntimeError(f"netproxy DELETE /toxics/{name}: 404")
        del self.toxics[name]


def spec(**fields: Any) -> FaultSpec:
    """A plan's fault entry, validated as the plan validates it."""
    return ADAPTER.validate_python(fields)


SCHEDULERS: list[FaultScheduler] = []


def scheduler(tmp_path: Path, faults: list[FaultSpec], **kwargs: Any) -> FaultScheduler:
    writer = TableWriter(tmp_path, schema.FAULTS)
    sched = FaultScheduler(faults, kwargs.pop("admin", None), writer, lambda _: 0, **kwargs)
    SCHEDULERS.append(sched)
    return sched


@pytest.fixture(autouse=True)
def end_fault_greenlets() -> Iterator[None]:
    """A test that fails mid-fault leaves no fault running into the next test: killing a
    fault's greenlet runs its rollback and kills the command it was running."""
    yield
    while SCHEDULERS:
        gevent.killall(SCHEDULERS.pop()._greenlets, block=True, timeout=10)


def rows(tmp_path: Path) -> list[dict[str, Any]]:
    return read_jsonl(tmp_path / f"{schema.FAULTS}.jsonl").rows


def run_to_end(sched: FaultScheduler, n_rows: int, tmp_path: Path) -> list[dict[str, Any]]:
    sched.start(time.monotonic())
    wait_until(
        lambda: sched.fired == len(sched.faults) and len(rows(tmp_path)) == n_rows,
        what=f"{len(sched.faults)} faults to fire and {n_rows} rows",
    )
    sched.stop()
    return rows(tmp_path)


Sleepers = Callable[[str], subprocess.Popen[bytes]]


@pytest.fixture
def sleepers() -> Iterator[Sleepers]:
    """Starts `sleep` processes whose command lines carry a marker; kills what is left."""
    started: list[subprocess.Popen[bytes]] = []

    def start(marker: str) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(["sleep", marker]))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()


def marker(n: int) -> str:
    """A sleep duration that no other process on this machine has on its command line."""
    return f"{900 + n}.{os.getpid()}"


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_kill_by_pid_then_the_restart_command(tmp_path: Path, sleepers: Sleepers) -> None:
    victim = sleepers(marker(1))
    pidfile = tmp_path / "new.pid"
    restart = f"sleep {marker(2)} & echo $! > {pidfile}; echo restarted"
    fault = spec(
        kind="signal",
        at_s=0,
        signal="KILL",
        pid=victim.pid,
        target="r0",
        restart_command=restart,
        restart_after_s=0,
    )
    [row] = run_to_end(scheduler(tmp_path, [fault]), 1, tmp_path)
    assert victim.wait(timeout=WAIT_S) == -signal.SIGKILL
    new_pid = int(pidfile.read_text())
    try:
        assert psutil.Process(new_pid).is_running()
        assert (row["kind"], row["target"], row["pid"], row["outcome"]) == (
            "signal",
            "r0",
            victim.pid,
            "ok",
        )
        assert row["rollback"] == "restart_command exited 0"
        params = json.loads(row["params"])
        assert params["restart_exit_code"] == 0 and params["restart_output"] == "restarted\n"
        assert row["t_start"] <= row["t_end"]
    finally:
        psutil.Process(new_pid).kill()


def test_stop_by_match_is_continued_even_when_the_run_ends_mid_fault(
    tmp_path: Path, sleepers: Sleepers
) -> None:
    mark = marker(3)
    victim = psutil.Process(sleepers(mark).pid)
    fault = spec(kind="signal", at_s=0, signal="STOP", match=f"sleep {mark}", duration_s=600)
    sched = scheduler(tmp_path, [fault])
    sched.start(time.monotonic())
    wait_until(lambda: victim.status() == psutil.STATUS_STOPPED, what="the STOP to take effect")
    sched.stop()  # interrupts the 600 s hold: the CONT must still be sent
    assert victim.status() != psutil.STATUS_STOPPED
    [row] = rows(tmp_path)
    assert row["pid"] == victim.pid and row["target"] == f"match:sleep {mark}"
    assert row["outcome"] == "ok" and row["rollback"] == "resumed (CONT)"
    assert json.loads(row["params"])["matched_pids"] == [victim.pid]


def test_match_refuses_no_process_and_two_processes(tmp_path: Path, sleepers: Sleepers) -> None:
    mark, absent = marker(4), marker(5)
    twins = sorted(sleepers(mark).pid for _ in range(2))
    faults: list[FaultSpec] = [
        spec(kind="signal", at_s=0, signal="KILL", match=f"sleep {mark}"),
        spec(kind="signal", at_s=0, signal="KILL", match=f"sleep {absent}"),
    ]
    by_target = {r["target"]: r for r in run_to_end(scheduler(tmp_path, faults), 2, tmp_path)}
    two, none = by_target[f"match:sleep {mark}"], by_target[f"match:sleep {absent}"]
    assert two["outcome"] == (
        f"failed: match 'sleep {mark}': 2 processes match (pids {twins[0]}, {twins[1]}), and it "
        "must be exactly one (kvgate's own processes are left out); nothing was signalled. "
        "Name one process (its port, its model), or give pid or pidfile"
    )
    assert none["outcome"] == (
        f"failed: match 'sleep {absent}': 0 processes match, and it must be exactly one "
        "(kvgate's own processes are left out); nothing was signalled. Name one process "
        "(its port, its model), or give pid or pidfile"
    )
    for row in (two, none):
        assert row["t_start"] is None and row["pid"] is None and row["rollback"] == "none"
    assert not any(gone(pid) for pid in twins)


def test_pidfile_is_read_when_the_fault_fires_and_own_pids_are_refused(
    tmp_path: Path, sleepers: Sleepers
) -> None:
    victim = sleepers(marker(6))
    pidfile = tmp_path / "server.pid"
    faults: list[FaultSpec] = [
        spec(kind="signal", at_s=0, signal="TERM", pidfile=str(pidfile)),
        spec(kind="signal", at_s=0, signal="TERM", pid=os.getpid()),
        spec(kind="signal", at_s=0, signal="TERM", pidfile=str(tmp_path / "absent.pid")),
    ]
    pidfile.write_text(f"{victim.pid}\n")
    by_target = {r["target"]: r for r in run_to_end(scheduler(tmp_path, faults), 3, tmp_path)}
    assert victim.wait(timeout=WAIT_S) == -signal.SIGTERM
    assert by_target[f"pidfile:{pidfile}"]["outcome"] == "ok"
    assert by_target[f"pidfile:{pidfile}"]["rollback"] == "none"  # no restart_command
    assert by_target[f"pid:{os.getpid()}"]["outcome"] == (
        f"failed: pid {os.getpid()} is one of kvgate's own processes; nothing was signalled"
    )
    absent = by_target[f"pidfile:{tmp_path / 'absent.pid'}"]["outcome"]
    assert absent.startswith("failed: pidfile") and "cannot be read" in absent


def test_a_failed_restart_fails_the_fault(tmp_path: Path, sleepers: Sleepers) -> None:
    victim = sleepers(marker(7))
    fault = spec(
        kind="signal",
        at_s=0,
        signal="KILL",
        pid=victim.pid,
        restart_command="echo no such unit >&2; exit 5",
        restart_after_s=0,
    )
    [row] = run_to_end(scheduler(tmp_path, [fault]), 1, tmp_path)
    assert row["outcome"] == "failed: rollback: restart_command exited 5 (no such unit)"
    assert row["t_start"] is not None


def test_command_and_its_rollback_are_recorded(tmp_path: Path) -> None:
    fault = spec(
        kind="command",
        at_s=0,
        command="echo stopped vllm",
        rollback="echo started vllm",
        target="r1",
    )
    [row] = run_to_end(scheduler(tmp_path, [fault]), 1, tmp_path)
    assert (row["kind"], row["target"], row["outcome"]) == ("command", "r1", "ok")
    assert row["rollback"] == "rollback command exited 0"
    params = json.loads(row["params"])
    assert (params["exit_code"], params["output"]) == (0, "stopped vllm\n")
    assert (params["rollback_exit_code"], params["rollback_output"]) == (0, "started vllm\n")


def test_each_row_says_what_its_fault_did(tmp_path: Path) -> None:
    """The declared effect once the fault applied in full; `none` when it did not."""
    faults: list[FaultSpec] = [
        spec(kind="command", at_s=0, command="true", effect="kills", target="r0"),
        spec(kind="command", at_s=0, command="exit 1", effect="kills", target="r1"),
        spec(kind="command", at_s=0, command="true", target="r2"),
        network_fault(0.01, type="reset_peer", attributes={}),
    ]
    sched = scheduler(tmp_path, faults, proxy=FakeProxy())
    by_target = {r["target"]: r for r in run_to_end(sched, 4, tmp_path)}
    assert by_target["r0"]["effect"] == "kills"
    assert by_target["r1"]["effect"] == "none"  # it exited 1: it killed nothing
    assert by_target["r2"]["effect"] == "none"  # a command that declares nothing
    assert by_target["proxy"]["effect"] == "breaks_connections"


def test_a_failing_command_still_runs_its_rollback(tmp_path: Path) -> None:
    done = tmp_path / "rolled-back"
    fault = spec(
        kind="command",
        at_s=0,
        command="echo 'no such container' >&2; exit 3",
        rollback=f"touch {done}",
        rollback_after_s=600,
    )
    [row] = run_to_end(scheduler(tmp_path, [fault]), 1, tmp_path)
    assert row["outcome"] == "failed: command exited 3 (no such container)"
    assert done.exists() and row["rollback"] == "rollback command exited 0"
    assert json.loads(row["params"])["exit_code"] == 3


def test_a_command_past_its_timeout_is_killed_with_what_it_started(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    fault = spec(
        kind="command",
        at_s=0,
        command=f"sleep 600 & echo $! > {child}; wait",
        timeout_s=0.5,
        rollback="exit 1",
    )
    [row] = run_to_end(scheduler(tmp_path, [fault]), 1, tmp_path)
    assert row["outcome"] == (
        "failed: command timed out after 0.5s and was killed; "
        "rollback: rollback command exited 1 (no output)"
    )
    assert json.loads(row["params"])["exit_code"] is None
    pid = int(child.read_text())
    wait_until(lambda: gone(pid), what=f"the command's child {pid} to be killed")


@pytest.mark.timeout(60)  # it takes a second; a stop() that waits for the 600 s sleep hangs
def test_a_command_interrupted_by_the_end_of_the_run_is_killed_and_rolled_back(
    tmp_path: Path,
) -> None:
    started, done = tmp_path / "started", tmp_path / "rolled-back"
    fault = spec(
        kind="command",
        at_s=0,
        command=f"touch {started}; sleep 600",
        timeout_s=900,
        rollback=f"touch {done}",
    )
    sched = scheduler(tmp_path, [fault])
    sched.start(time.monotonic())
    wait_until(started.exists, what="the command to start")
    sched.stop()
    [row] = rows(tmp_path)
    assert row["outcome"] == "failed: interrupted (the run ended) before it was applied in full"
    assert done.exists()


def network_fault(duration_s: float = 600, **toxic: Any) -> NetworkFault:
    toxic_spec = {"type": "latency", "attributes": {"latency": 250}} | toxic
    fault = spec(kind="network", at_s=0, duration_s=duration_s, toxic=toxic_spec)
    assert isinstance(fault, NetworkFault)
    return fault


def test_network_adds_its_toxic_and_removes_it_in_the_rollback(tmp_path: Path) -> None:
    proxy = FakeProxy()
    sched = scheduler(tmp_path, [network_fault(stream="upstream", toxicity=0.5)], proxy=proxy)
    sched.start(time.monotonic())
    wait_until(lambda: proxy.toxics, what="the toxic to be added")
    [(name, toxic)] = proxy.toxics.items()
    assert toxic == {
        "type": "latency",
        "attributes": {"latency": 250},
        "stream": "upstream",
        "toxicity": 0.5,
    }
    sched.stop()  # mid-duration: the toxic must go now
    assert proxy.toxics == {} and proxy.calls == [("add", name), ("remove", name)]
    [row] = rows(tmp_path)
    assert (row["kind"], row["target"], row["outcome"]) == ("network", "proxy", "ok")
    assert row["rollback"] == f"removed toxic {name}"
    assert json.loads(row["params"])["toxic"]["type"] == "latency"


def test_network_failures_are_recorded(tmp_path: Path) -> None:
    refused = FakeProxy(fail_add=True)
    [row] = run_to_end(scheduler(tmp_path, [network_fault()], proxy=refused), 1, tmp_path)
    assert row["outcome"] == (
        "failed: the proxy did not add the latency toxic: netproxy POST /toxics: 400 bad toxic"
    )
    assert row["t_start"] is None and [c for c, _ in refused.calls] == ["add", "remove"]
    stuck, again = FakeProxy(fail_remove=True), tmp_path / "again"
    again.mkdir()
    [row] = run_to_end(scheduler(again, [network_fault(0.01)], proxy=stuck), 1, again)
    assert row["t_start"] is not None and row["outcome"].startswith(
        "failed: rollback: the proxy did not remove toxic kvgate-"
    )


def test_faults_that_cannot_act_on_this_run_stop_it_before_the_load(tmp_path: Path) -> None:
    plan = plan_with(tmp_path, "  - {kind: kill, at_s: 5}\n")
    with pytest.raises(FaultError, match="use a signal, command or network fault"):
        scheduler(tmp_path, plan.faults)  # no gateway admin API (an external target)
    with pytest.raises(FaultError, match="network faults need kvgate's proxy"):
        scheduler(tmp_path, [network_fault()])
    assert not (tmp_path / f"{schema.FAULTS}.jsonl").exists() or rows(tmp_path) == []


def test_every_fault_that_fired_writes_exactly_one_row(tmp_path: Path, sleepers: Sleepers) -> None:
    victim = sleepers(marker(8))
    faults: list[FaultSpec] = [
        spec(kind="signal", at_s=0, signal="STOP", pid=victim.pid, duration_s=0.05),
        spec(kind="signal", at_s=0, signal="KILL", match=f"sleep {marker(9)}"),
        spec(kind="command", at_s=0, command="true"),
        spec(kind="command", at_s=0, command="false", rollback="true"),
        network_fault(0.05),
        spec(kind="command", at_s=600, command="true"),  # never fires
    ]
    sched = scheduler(tmp_path, faults, proxy=FakeProxy())
    sched.start(time.monotonic())
    wait_until(lambda: len(rows(tmp_path)) == 5, what="a row from each of the five fired faults")
    sched.stop()
    written = rows(tmp_path)
    assert len(written) == 5 == sched.fired and len({r["fault_id"] for r in written}) == 5
    assert sorted(r["kind"] for r in written) == [
        "command",
        "command",
        "network",
        "signal",
        "signal",
    ]
    assert sched.failed == 2  # the match that found nothing, and `false`


# -- kvgate's proxy in the traffic's path --------------------------------------------------


class Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=WAIT_S) as resp:
        return bytes(resp.read())


def test_only_plans_with_a_network_fault_get_the_proxy(tmp_path: Path) -> None:
    plain = plan_with(tmp_path, "  - {kind: command, at_s: 5, command: 'true'}\n")
    assert start_proxy_in_path(plain, "http://127.0.0.1:9") is None
    net = plan_with(
        tmp_path, "  - {kind: network, at_s: 5, duration_s: 1, toxic: {type: timeout}}\n"
    )
    with pytest.raises(FaultError, match="every Locust worker on this host"):
        start_proxy_in_path(net, "http://127.0.0.1:9", remote_workers=True)


def test_a_reset_toxic_through_the_real_proxy(
    tmp_path: Path, upstream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The proxy is up in a second; on a busy machine it has taken 15 s, past the default 10.
    start_proxy = harness.netproxy.client.start_proxy
    monkeypatch.setattr(
        harness.netproxy.client, "start_proxy", functools.partial(start_proxy, ready_timeout_s=60)
    )
    net = plan_with(
        tmp_path, "  - {kind: network, at_s: 5, duration_s: 1, toxic: {type: timeout}}\n"
    )
    proxy = start_proxy_in_path(net, upstream + "/v1")
    assert proxy is not None
    try:
        assert proxy.describe()["upstream"] == upstream.removeprefix("http://")
        assert proxy.traffic_url == proxy.describe()["listen"] + "/v1"
        assert get(proxy.traffic_url + "/models") == b"/v1/models"  # the path is kept
        fault = network_fault(600, type="reset_peer", attributes={})
        sched = scheduler(tmp_path, [fault], proxy=proxy.client)
        sched.start(time.monotonic())
        wait_until(lambda: len(proxy.process.client.toxics()) == 1, what="the proxy's toxic")
        with pytest.raises((ConnectionResetError, urllib.error.URLError)):
            get(proxy.traffic_url + "/models")
        sched.stop()
        assert proxy.process.client.toxics() == []
        assert get(proxy.traffic_url + "/models") == b"/v1/models"
        [row] = rows(tmp_path)
        assert row["outcome"] == "ok" and row["rollback"].startswith("removed toxic kvgate-")
    finally:
        final = proxy.stop()
    assert not psutil.pid_exists(proxy.process.pid)
    assert final["stats"]["reset"] >= 1 and final["stats"]["accepted"] >= 3


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_a_run_with_a_network_fault_puts_the_proxy_in_the_users_path(tmp_path: Path) -> None:
    run_dir = tmp_path / "net"
    faults = (
        "faults=[{kind: network, at_s: 2, duration_s: 2, toxic: {type: latency, "
        "attributes: {latency: 50}}}, {kind: command, at_s: 1, command: 'echo hi', target: r0}]"
    )
    quick = ["load.duration_s=8", "load.idle_before_s=1", "load.idle_after_s=1", faults]
    cmd = [sys.executable, "-m", "harness.run_cmd", str(PLANS / "smoke.yaml")]
    cmd += ["--out", str(run_dir), "--no-gates", *(a for s in quick for a in ("--set", s))]
    root = PLANS.parents[1]
    # The run takes ~15 s; the timeout is for a hung one.
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((run_dir / "meta.json").read_text())
    proxy = meta["target"]["proxy"]
    assert proxy["upstream"] == meta["target"]["url"].removeprefix("http://")
    assert not psutil.pid_exists(proxy["pid"])  # stopped at teardown
    assert proxy["stats"]["accepted"] > 0 and proxy["stats"]["bytes_downstream"] > 0
    run = load_run(run_dir)
    by_kind = {r["kind"]: r for r in run.faults.to_dict("records")}
    assert by_kind["network"]["outcome"] == "ok" and by_kind["command"]["outcome"] == "ok"
    assert by_kind["network"]["rollback"].startswith("removed toxic kvgate-")
    assert (run.requests["outcome"] == "ok").sum() > len(run.requests) / 2
