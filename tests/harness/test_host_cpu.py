"""The host's CPU as the sampler splits it (harness/samplers/host.py): kvgate's own process
tree, the target's, and the foreign rest. Fake scans and counters, except the last tests,
which read this process's own tree through psutil."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import psutil
import pytest

from contract.host import HostCpu
from harness.samplers.host import (
    HostCpuSampler,
    HostTimes,
    Proc,
    TargetFinder,
    TargetPids,
    TreeCpu,
    is_this_host,
    listening_pid,
    scan_processes,
)

RUN, NEIGHBOUR, SERVER = 100, 900, 300  # the kvgate run, a neighbour, an external server
T0 = 1_000.0


@dataclass
class FakeHost:
    """A host whose processes and counters a test sets, one second per `tick`."""

    procs: dict[int, Proc] = field(default_factory=dict)
    busy_s: float = 0.0
    steal_s: float = 0.0
    t: float = T0

    def start(self, pid: int, ppid: int, own_s: float = 0.0, reaped_s: float = 0.0) -> None:
        self.procs[pid] = Proc(pid, ppid, self.t, own_s, reaped_s)

    def run(self, pid: int, own_s: float = 0.0, reaped_s: float = 0.0) -> None:
        """`pid` uses `own_s` more CPU, and its reaped children's grow by `reaped_s`."""
        p = self.procs[pid]
        self.procs[pid] = Proc(p.pid, p.ppid, p.started, p.own_s + own_s, p.reaped_s + reaped_s)

    def end(self, pid: int) -> None:
        del self.procs[pid]

    def sampler(self, own: int = RUN, target: TargetPids | None = None) -> HostCpuSampler:
        return HostCpuSampler(
            own,
            lambda: target or TargetPids(),
            scan=lambda: dict(self.procs),
            times=lambda: HostTimes(self.busy_s, self.steal_s),
            cpus=2,
            wall=lambda: self.t,
            clock=lambda: self.t,
        )

    def tick(self, busy_s: float, steal_s: float = 0.0) -> None:
        """One second passes in which the host's processes were busy `busy_s` CPU-seconds."""
        self.t += 1.0
        self.busy_s += busy_s
        self.steal_s += steal_s


def cores(rows: list[dict[str, object]]) -> dict[str, float]:
    values = {str(r["metric"]): r["value"] for r in rows}
    return {k: float(v) for k, v in values.items() if isinstance(v, float)}


@pytest.fixture
def host() -> FakeHost:
    h = FakeHost()
    h.start(1, 0)  # init
    h.start(RUN, 1, own_s=5.0, reaped_s=2.0)
    h.start(NEIGHBOUR, 1, own_s=50.0)
    return h


def test_the_first_sample_only_sets_the_baselines(host: FakeHost) -> None:
    assert host.sampler().sample() == []


def test_a_child_reaped_between_two_samples_adds_nothing_foreign(host: FakeHost) -> None:
    """A child no sample saw (started and reaped within the second): its CPU is in its
    parent's children_* and counts as kvgate's."""
    sampler = host.sampler()
    sampler.sample()
    host.run(RUN, own_s=0.2, reaped_s=0.5)
    host.tick(busy_s=0.7)
    got = cores(sampler.sample())
    assert got[HostCpu.KVGATE] == pytest.approx(0.7)
    assert got[HostCpu.FOREIGN] == pytest.approx(0.0)
    assert got[HostCpu.BUSY] == pytest.approx(0.7) and got[HostCpu.CPUS] == 2


def test_a_child_seen_and_then_reaped_counts_once_and_never_below_nothing(
    host: FakeHost,
) -> None:
    """The running check's child, seen by one sample with 0.3 s of CPU and reaped before the
    next with 0.8 s in all: its parent's children_* then holds the whole 0.8 s, of which
    only 0.5 s is the second's."""
    sampler = host.sampler()
    sampler.sample()
    host.start(101, RUN, own_s=0.3)  # started after the first sample: all of it is new
    host.tick(busy_s=0.3)
    assert cores(sampler.sample())[HostCpu.KVGATE] == pytest.approx(0.3)
    host.end(101)
    host.run(RUN, reaped_s=0.8)
    host.tick(busy_s=0.5)
    got = cores(sampler.sample())
    assert got[HostCpu.KVGATE] == pytest.approx(0.5)
    assert got[HostCpu.FOREIGN] == pytest.approx(0.0)


def test_grandchildren_reaped_within_one_second_are_counted_through_their_reaper(
    host: FakeHost,
) -> None:
    """A Locust worker's helper (seen, 1 s of CPU) reaped by the worker, which the run then
    reaps: the run's children_* grows by both lives, less what the last sample read."""
    sampler = host.sampler()
    host.start(110, RUN, own_s=4.0)
    host.start(111, 110, own_s=1.0)
    sampler.sample()
    host.end(111)
    host.end(110)
    host.run(RUN, reaped_s=4.5 + 1.2)  # the worker's 4.5 s, its helper's 1.2 s with it
    host.tick(busy_s=0.7)
    got = cores(sampler.sample())
    assert got[HostCpu.KVGATE] == pytest.approx(0.7)
    assert got[HostCpu.FOREIGN] == pytest.approx(0.0)


def test_a_child_orphaned_and_reaped_elsewhere_cannot_make_kvgates_cpu_negative(
    host: FakeHost,
) -> None:
    """vLLM's engine process dies with its parent and init reaps it: the run's children_*
    never hold its 90 s, so taking them off would read 90 cores foreign for a second."""
    sampler = host.sampler()
    host.start(120, RUN, own_s=10.0)
    host.start(121, 120, own_s=90.0)
    sampler.sample()
    host.end(121)
    host.end(120)
    host.run(RUN, own_s=0.1, reaped_s=10.2)  # the parent's life only
    host.tick(busy_s=0.4)
    got = cores(sampler.sample())
    assert got[HostCpu.KVGATE] == pytest.approx(0.1)
    assert got[HostCpu.FOREIGN] == pytest.approx(0.3)


def test_a_neighbours_cpu_is_foreign_and_steal_adds_to_it(host: FakeHost) -> None:
    sampler = host.sampler()
    sampler.sample()
    host.run(RUN, own_s=0.4)
    host.run(NEIGHBOUR, own_s=1.1)
    host.tick(busy_s=1.5, steal_s=0.3)
    got = cores(sampler.sample())
    assert got[HostCpu.KVGATE] == pytest.approx(0.4)
    assert got[HostCpu.STEAL] == pytest.approx(0.3)
    assert got[HostCpu.FOREIGN] == pytest.approx(1.1 + 0.3)


def test_an_external_targets_tree_is_not_foreign_and_one_kvgate_started_counts_once(
    host: FakeHost,
) -> None:
    host.start(SERVER, 1, own_s=30.0)
    host.start(SERVER + 1, SERVER, own_s=70.0)  # its engine process
    host.start(150, RUN, own_s=8.0)  # a reference gateway kvgate started: kvgate's and target's
    external = host.sampler(target=TargetPids(pids=(SERVER,)))
    managed = host.sampler(target=TargetPids(pids=(150,)))
    external.sample()
    managed.sample()
    host.run(SERVER, own_s=0.2)
    host.run(SERVER + 1, own_s=0.6)
    host.run(150, own_s=0.5)
    host.tick(busy_s=1.3)
    got = cores(external.sample())
    assert got[HostCpu.TARGET] == pytest.approx(0.8) and got[HostCpu.KVGATE] == pytest.approx(0.5)
    assert got[HostCpu.FOREIGN] == pytest.approx(0.0)
    got = cores(managed.sample())
    assert got[HostCpu.TARGET] == pytest.approx(0.5) and got[HostCpu.KVGATE] == pytest.approx(0.5)
    assert got[HostCpu.FOREIGN] == pytest.approx(0.8)  # the external server is not its target


def test_a_process_first_seen_long_after_it_started_brings_none_of_its_past(
    host: FakeHost,
) -> None:
    """The target's process found by its port only now: its 100 s so far are not this
    second's. A server restarted since the last sample brings all of its CPU."""
    host.start(SERVER, 1, own_s=100.0)
    target = TargetPids()
    sampler = HostCpuSampler(
        RUN,
        lambda: target,
        scan=lambda: dict(host.procs),
        times=lambda: HostTimes(host.busy_s, host.steal_s),
        cpus=2,
        wall=lambda: host.t,
        clock=lambda: host.t,
    )
    sampler.sample()
    host.tick(busy_s=0.0)
    sampler.sample()
    target = TargetPids(pids=(SERVER,))
    host.tick(busy_s=0.0)
    assert cores(sampler.sample())[HostCpu.TARGET] == 0.0
    host.end(SERVER)
    host.tick(busy_s=0.5)
    host.start(SERVER + 5, 1, own_s=0.5)  # restarted within the second, by a restart command
    target = TargetPids(pids=(SERVER + 5,))
    got = cores(sampler.sample())
    assert got[HostCpu.TARGET] == pytest.approx(0.5) and got[HostCpu.FOREIGN] == 0.0


def test_a_pid_the_kernel_hands_out_again_is_another_process(host: FakeHost) -> None:
    sampler = host.sampler()
    host.start(130, RUN, own_s=40.0)
    sampler.sample()
    host.end(130)
    host.run(RUN, reaped_s=40.2)
    host.tick(busy_s=0.2)
    host.start(130, RUN, own_s=0.1)  # the same PID, a new process of the run
    host.run(NEIGHBOUR, own_s=0.1)
    host.tick(busy_s=0.2)  # the second tick: the counters moved over two seconds
    got = cores(sampler.sample())
    assert got[HostCpu.KVGATE] == pytest.approx(0.3 / 2)
    assert got[HostCpu.FOREIGN] == pytest.approx(0.1 / 2)


def test_a_process_that_outlives_its_parent_stays_kvgates(host: FakeHost) -> None:
    sampler = host.sampler()
    host.start(140, RUN, own_s=1.0)
    host.start(141, 140, own_s=1.0)
    sampler.sample()
    host.end(140)
    host.run(RUN, reaped_s=1.0)
    host.procs[141] = Proc(141, 1, host.procs[141].started, 1.6, 0.0)  # reparented to init
    host.tick(busy_s=0.6)
    got = cores(sampler.sample())
    assert got[HostCpu.KVGATE] == pytest.approx(0.6) and got[HostCpu.FOREIGN] == 0.0


def test_a_target_that_cannot_be_found_leaves_the_foreign_cpu_unmeasured(host: FakeHost) -> None:
    sampler = host.sampler(target=TargetPids(unmeasured="no process listens on port 8000"))
    sampler.sample()
    host.tick(busy_s=1.0)
    rows = sampler.sample()
    assert HostCpu.FOREIGN not in {r["metric"] for r in rows}
    [unmeasured] = [r for r in rows if r["metric"] == HostCpu.UNMEASURED]
    assert unmeasured["labels"] == "reason=no process listens on port 8000"


def test_without_kvgates_own_process_the_foreign_cpu_is_unmeasured(host: FakeHost) -> None:
    sampler = host.sampler(own=4242)
    sampler.sample()
    host.tick(busy_s=1.0)
    rows = sampler.sample()
    assert HostCpu.FOREIGN not in {r["metric"] for r in rows}
    assert "PID 4242" in str(next(r["labels"] for r in rows if r["metric"] == HostCpu.UNMEASURED))


# -- finding the target ----------------------------------------------------------------------


def test_the_given_pids_are_the_targets_and_a_remote_target_has_none_here() -> None:
    assert TargetFinder(lambda: [7], "http://127.0.0.1:8000")() == TargetPids(pids=(7,))
    remote = TargetFinder(lambda: [], "http://gpu-7:8000", local=lambda name: False)
    assert remote() == TargetPids()


def test_a_loopback_target_is_found_by_the_process_listening_on_its_port() -> None:
    asked: list[int] = []

    def listener(port: int) -> int | None:
        asked.append(port)
        return os.getpid()

    finder = TargetFinder(lambda: [], "http://127.0.0.1:18080/v1", listener=listener)
    assert finder() == TargetPids(pids=(os.getpid(),))
    assert finder() == TargetPids(pids=(os.getpid(),))
    assert asked == [18080]  # looked up once while the process lives


def test_a_target_nobody_may_find_is_unmeasured_with_the_reason() -> None:
    def denied(port: int) -> int | None:
        raise psutil.AccessDenied()

    finder = TargetFinder(lambda: [], "http://localhost:8000", listener=denied)
    why = finder().unmeasured
    assert why is not None and "could not be listed" in why and "target.pidfile" in why
    nobody = TargetFinder(lambda: [], "http://localhost:8000", listener=lambda port: None)
    why = nobody().unmeasured
    assert why is not None and "port 8000" in why


# -- through psutil ----------------------------------------------------------------------------


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="children_* hold reaped children on Linux"
)
def test_a_child_seen_and_reaped_between_scans_is_counted_once_through_psutil() -> None:
    """The kernel's own accounting: a child of this process, seen by one scan and reaped
    before the next, is counted exactly once (its rusage says how much it used in all)."""
    tree, me = TreeCpu(), os.getpid()
    burn = "sum(range(20_000_000))"  # about a third of a second of CPU
    code = f"import sys; {burn}; print(flush=True); sys.stdin.readline(); {burn}"
    first = scan_processes()
    tree.update(first, {"kvgate": [me]}, time.time())
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    child.stdout.readline()  # it has used some CPU, and waits
    seen = tree.update(scan_processes(), {"kvgate": [me]}, time.time())
    child.stdin.write("\n")
    child.stdin.flush()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    last = scan_processes()
    reaped = tree.update(last, {"kvgate": [me]}, time.time())
    assert seen is not None and reaped is not None
    child_s = usage.ru_utime + usage.ru_stime
    own_s = last[me].own_s - first[me].own_s
    assert child_s > 0
    # /proc's counters tick in hundredths of a second, rusage in microseconds; counting
    # the child's first third of a second twice would be ten times this far off
    assert seen.total + reaped.total == pytest.approx(own_s + child_s, abs=0.03)


def test_the_process_listening_on_a_port_is_found_through_psutil() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        try:
            found = listening_pid(port)
        except psutil.AccessDenied:
            pytest.skip("this host does not let this user list its sockets")
        assert found == os.getpid()
        finder = TargetFinder(lambda: [], f"http://localhost:{port}")
        assert finder() == TargetPids(pids=(os.getpid(),))
    assert is_this_host("127.0.0.1") and is_this_host("localhost")
    assert not is_this_host("192.0.2.1")  # TEST-NET-1: documentation only, never a host's
