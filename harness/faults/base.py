"""What every fault kind shares: the action protocol, its context, and its journal row.

A kind is an action class built from its plan entry and the run's `FaultContext`;
`apply()` injects the fault and calls `record.begin()` at the moment it takes effect, and
`rollback()` undoes it. The scheduler runs the rollback in `finally` for every fault that
began, and writes the `FaultRecord` as one row of the faults table after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol


class FaultError(RuntimeError):
    """A fault could not be applied or rolled back (its row's outcome says why)."""


@dataclass(slots=True)
class FaultRecord:
    """One fault's journal: what it was, when it took effect, what went wrong, what undid it."""

    fault_id: str
    kind: str
    target: str
    params: dict[str, Any]  # the plan entry, plus what the fault learned (exit codes, ...)
    pid: int | None = None
    t_start: float | None = None  # set by begin(): None means nothing was injected
    t_end: float | None = None
    problems: list[str] = field(default_factory=list)
    rollback: list[str] = field(default_factory=list)

    def begin(self) -> None:
        self.t_start = time.time()

    def fail(self, why: str) -> None:
        self.problems.append(why)

    @property
    def outcome(self) -> str:
        return "failed: " + "; ".join(self.problems) if self.problems else "ok"

    def row(self) -> dict[str, Any]:
        return {
            "fault_id": self.fault_id,
            "kind": self.kind,
            "target": self.target,
            "pid": self.pid,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "params": json.dumps(self.params, sort_keys=True, default=str),
            "outcome": self.outcome,
            "rollback": ", ".join(self.rollback) or "none",
        }


class ReplicaAdminAPI(Protocol):
    """A deployment's control of its replicas, as the replica kinds use it: the reference
    gateway's admin API, or a managed engine. `restart_limit_s` bounds a whole restart
    (the death noticed, the restart, health again)."""

    restart_limit_s: float

    def replica(self, replica_id: str) -> dict[str, Any]: ...

    def restart(self, replica_id: str) -> None: ...

    def wait_running(self, replica_id: str) -> int | None: ...

    def wait_dead(self, replica_id: str) -> None: ...


class ToxicClient(Protocol):
    """The control API of kvgate's proxy (harness.netproxy_client.ProxyClient), as the
    `network` kind uses it."""

    def add_toxic(
        self,
        name: str,
        type: str,
        attributes: dict[str, float],
        stream: str = "downstream",
        toxicity: float = 1.0,
    ) -> Any: ...

    def remove_toxic(self, name: str) -> Any: ...


def _no_pids() -> Collection[int]:
    return ()


@dataclass(frozen=True, slots=True)
class FaultContext:
    """What the faults of one run may act on; each kind uses its part and refuses to be
    built (at run start) when that part is missing."""

    recent_cancels: Callable[[float], int]  # cancellations seen in the last N seconds
    admin: ReplicaAdminAPI | None = None  # the reference gateway (replica kinds)
    proxy: ToxicClient | None = None  # kvgate's proxy in the traffic's path (network)
    own_pids: Callable[[], Collection[int]] = _no_pids  # kvgate's helpers: never signalled


class FaultAction(Protocol):
    """One fault of the plan, ready to fire.

    `apply()` calls `record.begin()` once the fault has taken effect and raises FaultError
    (or OSError) when it cannot; the scheduler then holds it `hold_s` and runs `rollback()`
    in `finally` if `record.t_start` is set, even when the run ends mid-fault.
    """

    target: str  # the faults row's target
    hold_s: float  # how long the fault lasts before its rollback
    rollback_limit_s: float  # the longest its rollback can take (stop() waits this long)

    def apply(self, record: FaultRecord) -> None: ...

    def rollback(self, record: FaultRecord) -> None: ...


# A kind's implementation: built from its plan entry (the kind's model) and the context.
ActionFactory = Callable[[Any, FaultContext], FaultAction]
