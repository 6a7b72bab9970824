"""Process fault injectors (Chaos Toolkit style: each fault has a rollback that runs in finally).

Faults run as greenlets in the Locust process; their calls are blocking-but-short (a signal,
one admin HTTP request), which gevent's patched sockets make cooperative. Each fault
writes one row to the faults table when its rollback has finished, whatever happened:
kill (SIGKILL, then the gateway's admin restart after a delay), pause (SIGSTOP, SIGCONT
after a duration), kill_during_storm (wait for a cancellation storm, then kill).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent

from harness.plan import Fault
from harness.rundir import TableWriter
from harness.samplers.http import request

log = logging.getLogger(__name__)
RESTART_WAIT_S = 30.0  # how long a restarted replica may take to report "running"
STOP_GRACE_S = 80.0  # how long stop() waits for rollbacks to finish
RESTART_ATTEMPTS = 3
RESTART_RETRY_S = 2.0
ADMIN_TIMEOUT_S = 5.0  # a gateway busy tokenizing long prompts can be slow to answer


class FaultError(RuntimeError):
    """A fault could not be applied (its row's outcome says why)."""


@dataclass(slots=True)
class FaultRecord:
    fault_id: str
    kind: str
    target: str
    params: dict[str, Any]
    pid: int | None = None
    t_start: float | None = None
    t_end: float | None = None
    outcome: str = "ok"
    rollback: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {
            "fault_id": self.fault_id,
            "kind": self.kind,
            "target": self.target,
            "pid": self.pid,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "params": json.dumps(self.params, sort_keys=True),
            "outcome": self.outcome,
            "rollback": ", ".join(self.rollback) or "none",
        }


class ReplicaAdmin:
    """The gateway's admin API: where a replica's process is, and restarting it."""

    def __init__(self, gateway_url: str, admin_key: str) -> None:
        self.url = gateway_url.rstrip("/") + "/admin/replicas"
        self.key = admin_key

    def replica(self, replica_id: str) -> dict[str, Any]:
        resp = request(self.url, token=self.key, timeout_s=ADMIN_TIMEOUT_S)
        if resp.status != 200:
            raise FaultError(f"GET /admin/replicas answered HTTP {resp.status}")
        for item in resp.json():
            if item.get("id") == replica_id:
                return dict(item)
        raise FaultError(f"the gateway lists no replica {replica_id!r}")

    def restart(self, replica_id: str) -> None:
        """POST the restart; a 503 (the replica failed while starting) is retried a few times."""
        # the gateway answers a restart once the replica is up, which can take a while
        url = f"{self.url}/{replica_id}/restart"
        problems = []
        for attempt in range(RESTART_ATTEMPTS):
            resp = request(url, method="POST", token=self.key, timeout_s=RESTART_WAIT_S)
            if resp.status < 300:
                return
            problems.append(f"HTTP {resp.status}: {resp.body[:200].decode(errors='replace')}")
            if resp.status != 503 or attempt == RESTART_ATTEMPTS - 1:
                break
            gevent.sleep(RESTART_RETRY_S)
        raise FaultError(f"restart of {replica_id} failed: {'; '.join(problems)}")

    def wait_running(self, replica_id: str, timeout_s: float = RESTART_WAIT_S) -> int | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, FaultError):
                item = self.replica(replica_id)
                if item.get("state") == "running":
                    return item.get("pid")
            gevent.sleep(0.25)
        raise FaultError(f"{replica_id} was not running {timeout_s}s after its restart")

    def wait_dead(self, replica_id: str, timeout_s: float = 10.0) -> None:
        """The gateway must notice the death before it accepts a restart."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, FaultError):
                if self.replica(replica_id).get("state") == "dead":
                    return
            gevent.sleep(0.1)


class FaultScheduler:
    """Fires the plan's faults at their times; `stop()` ends them with their rollbacks run.

    Invariant: every fault that started writes exactly one row, after its rollback.
    """

    def __init__(
        self,
        faults: list[Fault],
        admin: ReplicaAdmin,
        writer: TableWriter,
        recent_cancels: Callable[[float], int],
    ) -> None:
        self.faults = sorted(faults, key=lambda f: f.at_s)
        self.admin = admin
        self.writer = writer
        self.recent_cancels = recent_cancels
        self.fired = 0
        self.failed = 0
        self._greenlets: list[gevent.Greenlet] = []

    def start(self, load_start_monotonic: float) -> None:
        for fault in self.faults:
            delay = max(0.0, load_start_monotonic + fault.at_s - time.monotonic())
            self._greenlets.append(gevent.spawn_later(delay, self._run, fault))

    def stop(self) -> None:
        """Cancel faults not yet fired; interrupt running ones so their rollbacks run now."""
        for greenlet in self._greenlets:
            if not greenlet.started:
                greenlet.kill(block=False)
        gevent.killall([g for g in self._greenlets if g.started], block=True, timeout=STOP_GRACE_S)

    def _run(self, fault: Fault) -> None:
        params = fault.model_dump()
        record = FaultRecord(uuid.uuid4().hex[:12], fault.kind, fault.replica, params)
        self.fired += 1
        try:
            if fault.kind == "pause":
                self._pause(fault, record)
            else:
                if fault.kind == "kill_during_storm":
                    self._await_storm(fault, record)
                self._kill(fault, record)
        except (FaultError, OSError, ValueError) as exc:
            record.outcome = f"failed: {exc}"
        finally:
            if record.outcome != "ok":
                self.failed += 1
            record.t_end = time.time()
            self.writer.write(record.row())
            log.info(
                "fault %s %s on %s: %s", record.fault_id, fault.kind, fault.replica, record.outcome
            )

    def _await_storm(self, fault: Fault, record: FaultRecord) -> None:
        deadline = time.monotonic() + fault.storm_wait_s
        while time.monotonic() < deadline:
            seen = self.recent_cancels(2.0)
            if seen >= fault.min_cancels:
                record.params["cancels_in_last_2s"] = seen
                return
            gevent.sleep(0.1)
        raise FaultError(
            f"no cancellation storm ({fault.min_cancels} cancels in 2 s) within "
            f"{fault.storm_wait_s}s, so nothing was killed"
        )

    def _kill(self, fault: Fault, record: FaultRecord) -> None:
        record.pid = int(self.admin.replica(fault.replica)["pid"])
        record.t_start = time.time()
        try:
            os.kill(record.pid, signal.SIGKILL)
            gevent.sleep(fault.restart_after_s)
        finally:
            # the rollback runs even if the greenlet is killed mid-sleep (Ctrl-C, end of run)
            with gevent.Timeout(2 * RESTART_WAIT_S + 15, FaultError("restart took too long")):
                self.admin.wait_dead(fault.replica)
                self.admin.restart(fault.replica)
                new_pid = self.admin.wait_running(fault.replica)
                record.rollback.append(f"restarted (pid {new_pid})")

    def _pause(self, fault: Fault, record: FaultRecord) -> None:
        record.pid = int(self.admin.replica(fault.replica)["pid"])
        record.t_start = time.time()
        try:
            os.kill(record.pid, signal.SIGSTOP)
            gevent.sleep(fault.duration_s)
        finally:
            os.kill(record.pid, signal.SIGCONT)
            record.rollback.append("resumed")
