"""Replica faults, through the admin API of a deployment kvgate runs: kill (SIGKILL, then a
restart after a delay), pause (SIGSTOP, SIGCONT after a duration) and kill_during_storm
(wait for a cancellation storm, then kill). The reference gateway's admin API serves its
replicas; a managed engine (harness/engines/vllm_deployment.py) is one replica, `vllm`.
Each signal goes to the replica's whole process tree: a server's helper processes (vLLM's
EngineCore and worker) survive a kill of their parent and go on holding the GPU."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import gevent

from harness.faults.base import FaultContext, FaultError, FaultRecord, ReplicaAdminAPI
from harness.plan_faults import KillDuringStormFault, KillFault, PauseFault
from harness.proctree import signal_tree
from harness.samplers.http import request

RESTART_WAIT_S = 30.0  # how long a restarted replica may take to report "running"
RESTART_ATTEMPTS = 3
RESTART_RETRY_S = 2.0
ADMIN_TIMEOUT_S = 5.0  # a gateway busy tokenizing long prompts can be slow to answer
RESTART_LIMIT_S = 2 * RESTART_WAIT_S + 15  # wait for the death, restart, wait for "running"
STORM_WINDOW_S = 2.0


class ReplicaAdmin:
    """The gateway's admin API: where a replica's process is, and restarting it."""

    restart_limit_s = RESTART_LIMIT_S

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


def _admin(context: FaultContext, kind: str) -> ReplicaAdminAPI:
    if context.admin is None:
        raise FaultError(
            f"{kind} faults act through the reference gateway's admin API, and this target "
            "has none; against an external target use a signal, command or network fault"
        )
    return context.admin


class KillAction:
    """kill and kill_during_storm: SIGKILL the replica; the rollback restarts it."""

    def __init__(self, spec: KillFault | KillDuringStormFault, context: FaultContext) -> None:
        self.spec = spec
        self.admin = _admin(context, spec.kind)
        self.recent_cancels = context.recent_cancels
        self.target = spec.replica
        self.hold_s = spec.restart_after_s
        self.rollback_limit_s = self.admin.restart_limit_s

    def apply(self, record: FaultRecord) -> None:
        if isinstance(self.spec, KillDuringStormFault):
            self._await_storm(self.spec, record)
        record.pid = int(self.admin.replica(self.spec.replica)["pid"])
        record.begin()
        record.params["pids"] = signal_tree(record.pid, signal.SIGKILL)

    def rollback(self, record: FaultRecord) -> None:
        limit = self.rollback_limit_s
        with gevent.Timeout(limit, FaultError(f"restart took longer than {limit:g} s")):
            self.admin.wait_dead(self.spec.replica)
            self.admin.restart(self.spec.replica)
            new_pid = self.admin.wait_running(self.spec.replica)
            record.rollback.append(f"restarted (pid {new_pid})")

    def _await_storm(self, spec: KillDuringStormFault, record: FaultRecord) -> None:
        deadline = time.monotonic() + spec.storm_wait_s
        while time.monotonic() < deadline:
            seen = self.recent_cancels(STORM_WINDOW_S)
            if seen >= spec.min_cancels:
                record.params["cancels_in_last_2s"] = seen
                return
            gevent.sleep(0.1)
        raise FaultError(
            f"no cancellation storm ({spec.min_cancels} cancels in 2 s) within "
            f"{spec.storm_wait_s}s, so nothing was killed"
        )


class PauseAction:
    """pause: SIGSTOP the replica; the rollback is SIGCONT."""

    def __init__(self, spec: PauseFault, context: FaultContext) -> None:
        self.spec = spec
        self.admin = _admin(context, spec.kind)
        self.target = spec.replica
        self.hold_s = spec.duration_s
        self.rollback_limit_s = 1.0

    def apply(self, record: FaultRecord) -> None:
        record.pid = int(self.admin.replica(self.spec.replica)["pid"])
        record.begin()
        record.params["pids"] = signal_tree(record.pid, signal.SIGSTOP)

    def rollback(self, record: FaultRecord) -> None:
        assert record.pid is not None
        for pid in record.params.get("pids") or [record.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        record.rollback.append("resumed")
