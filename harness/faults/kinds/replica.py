"""Replica faults, through the admin API of a deployment kvgate runs: kill (SIGKILL, then a
restart after a delay), pause (SIGSTOP, SIGCONT after a duration) and kill_during_storm
(wait for a cancellation storm, then kill). The reference gateway's admin API serves its
replicas (harness/faults/admin.py); a managed engine (harness/engines/vllm_deployment.py)
is one replica, `vllm`. Each signal goes to the replica's whole process tree: a server's
helper processes (vLLM's EngineCore and worker) survive a kill of their parent and go on
holding the GPU."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Literal

import gevent
from pydantic import Field

from contract import FaultEffect
from harness.faults.base import (
    FaultContext,
    FaultError,
    FaultRecord,
    FaultSpec,
    ReplicaAdminAPI,
    fault_kind,
)
from harness.proctree import signal_tree

STORM_WINDOW_S = 2.0


class KillFault(FaultSpec):
    """SIGKILL a reference replica; restart it through the gateway after a delay."""

    kind: Literal["kill"] = "kill"
    replica: str = "r0"
    restart_after_s: float = Field(5.0, ge=0, le=600)

    def declared_effect(self) -> FaultEffect:
        return FaultEffect.KILLS

    def admin_replica(self) -> str:
        return self.replica


class PauseFault(FaultSpec):
    """SIGSTOP a reference replica; SIGCONT after `duration_s`."""

    kind: Literal["pause"] = "pause"
    replica: str = "r0"
    duration_s: float = Field(2.0, gt=0, le=600)

    def declared_effect(self) -> FaultEffect:
        return FaultEffect.PAUSES

    def admin_replica(self) -> str:
        return self.replica


class KillDuringStormFault(FaultSpec):
    """Wait for a cancellation storm (`min_cancels` in 2 s), then kill like `kill`."""

    kind: Literal["kill_during_storm"] = "kill_during_storm"
    replica: str = "r0"
    restart_after_s: float = Field(5.0, ge=0, le=600)
    storm_wait_s: float = Field(20.0, gt=0, le=600)  # how long to wait for the storm
    min_cancels: int = Field(3, ge=1)  # cancellations within 2 s

    def declared_effect(self) -> FaultEffect:
        return FaultEffect.KILLS

    def admin_replica(self) -> str:
        return self.replica


def _admin(context: FaultContext, kind: str) -> ReplicaAdminAPI:
    if context.admin is None:
        raise FaultError(
            f"{kind} faults act through the reference gateway's admin API, and this target "
            "has none; against an external target use a signal, command or network fault"
        )
    return context.admin


@fault_kind(KillFault, KillDuringStormFault)
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


@fault_kind(PauseFault)
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
