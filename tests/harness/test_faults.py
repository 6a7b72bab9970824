"""Fault injectors against real processes, with a fake admin API: rollbacks always run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from gates import schema
from gates.rundir import read_jsonl
from harness.faults.base import FaultError
from harness.faults.kinds.replica import KillDuringStormFault, KillFault, PauseFault
from harness.faults.scheduler import FaultScheduler
from harness.rundir import TableWriter
from tests.waiting import wait_until


class FakeAdmin:
    """Stands in for the gateway's admin API; 'restart' starts a new sleeper."""

    restart_limit_s = 10.0

    def __init__(self, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        self.procs = procs
        self.restarts: list[str] = []

    def replica(self, replica_id: str) -> dict[str, Any]:
        if replica_id not in self.procs:
            raise FaultError(f"the gateway lists no replica {replica_id!r}")
        return {"id": replica_id, "pid": self.procs[replica_id].pid, "state": "running"}

    def wait_dead(self, replica_id: str) -> None:
        self.procs[replica_id].wait(timeout=30)

    def restart(self, replica_id: str) -> None:
        self.restarts.append(replica_id)
        self.procs[replica_id] = sleeper()

    def wait_running(self, replica_id: str) -> int:
        return self.procs[replica_id].pid


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.fixture
def procs() -> Any:
    started = {"r0": sleeper()}
    yield started
    for proc in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def rows(tmp_path: Path) -> list[dict[str, Any]]:
    return read_jsonl(tmp_path / f"{schema.FAULTS}.jsonl").rows


def test_kill_then_restart_is_recorded(tmp_path: Path, procs: dict[str, Any]) -> None:
    victim = procs["r0"]
    admin = FakeAdmin(procs)
    writer = TableWriter(tmp_path, schema.FAULTS)
    sched = FaultScheduler(
        [KillFault(kind="kill", at_s=0.0, replica="r0", restart_after_s=0.2)],
        admin,
        writer,
        lambda w: 0,
    )
    sched.start(time.monotonic())
    try:
        wait_until(lambda: writer.rows == 1, what="the kill's row, written after its restart")
    finally:
        sched.stop()
    assert admin.restarts == ["r0"]
    assert victim.poll() == -9
    [row] = rows(tmp_path)
    assert row["kind"] == "kill" and row["pid"] == victim.pid and row["outcome"] == "ok"
    assert row["rollback"] == f"restarted (pid {procs['r0'].pid})"
    assert row["t_end"] >= row["t_start"] and json.loads(row["params"])["restart_after_s"] == 0.2


def test_pause_is_resumed_even_when_the_run_ends_mid_fault(
    tmp_path: Path, procs: dict[str, Any]
) -> None:
    sched = FaultScheduler(
        [PauseFault(kind="pause", at_s=0.0, replica="r0", duration_s=30.0)],
        FakeAdmin(procs),
        TableWriter(tmp_path, schema.FAULTS),
        lambda w: 0,
    )
    sched.start(time.monotonic())
    paused = psutil.Process(procs["r0"].pid)
    try:
        wait_until(lambda: paused.status() == psutil.STATUS_STOPPED, what="the pause to begin")
    finally:
        sched.stop()  # interrupts the 30 s pause: the rollback (SIGCONT) must still run
    assert psutil.Process(procs["r0"].pid).status() != psutil.STATUS_STOPPED
    [row] = rows(tmp_path)
    assert row["kind"] == "pause" and row["rollback"] == "resumed"


def test_kill_during_storm_waits_for_cancellations_and_fails_without_one(
    tmp_path: Path, procs: dict[str, Any]
) -> None:
    cancels = {"n": 0}
    writer = TableWriter(tmp_path, schema.FAULTS)
    sched = FaultScheduler(
        [
            KillDuringStormFault(
                kind="kill_during_storm",
                at_s=0.0,
                replica="r0",
                storm_wait_s=60,  # sees the storm long before; a busy machine does not matter
                min_cancels=3,
                restart_after_s=0.0,
            ),
            KillDuringStormFault(
                kind="kill_during_storm", at_s=0.0, replica="r9", storm_wait_s=0.3
            ),
        ],
        FakeAdmin(procs),
        writer,
        lambda w: cancels["n"],
    )
    victim = procs["r0"]
    sched.start(time.monotonic())
    try:
        wait_until(lambda: writer.rows == 1, what="r9's row: it gave up waiting for a storm")
        assert victim.poll() is None  # r0 is still waiting: no storm yet
        cancels["n"] = 4
        wait_until(lambda: writer.rows == 2, what="r0's row: killed in the storm and restarted")
    finally:
        sched.stop()
    assert victim.poll() == -9
    by_target = {r["target"]: r for r in rows(tmp_path)}
    assert by_target["r0"]["outcome"] == "ok"
    assert json.loads(by_target["r0"]["params"])["cancels_in_last_2s"] == 4
    assert by_target["r9"]["outcome"].startswith("failed: no cancellation storm")
