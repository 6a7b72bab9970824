"""What every fault kind shares: its plan entry's base model, the action protocol, its
context, its journal row, and `fault_kind`, the decorator by which a kind registers itself.

A kind is one module of harness/faults/kinds/ (harness.faults.registry finds them all). It
defines the model of its plan entry (a `FaultSpec` with `kind: Literal[...]`, which declares
the fault's effect) and an action class built from that entry and the run's `FaultContext`,
registered with `@fault_kind(Model)`. `apply()` injects the fault and calls `record.begin()`
at the moment it takes effect, and `rollback()` undoes it. The scheduler runs the rollback
in `finally` for every fault that began, and writes the `FaultRecord` as one row of the
faults table after it.
"""

from __future__ import annotations

import inspect
import json
import time
from abc import abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from contract import FaultEffect


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
    # what it did to its target: its entry's declared effect once apply() completed (NONE
    # until then, and for good when it did not: a command that failed killed nothing)
    effect: FaultEffect = FaultEffect.NONE
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
            "effect": str(self.effect),
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

    @property
    def restart_limit_s(self) -> float: ...

    def replica(self, replica_id: str) -> dict[str, Any]: ...

    def restart(self, replica_id: str) -> None: ...

    def wait_running(self, replica_id: str) -> int | None: ...

    def wait_dead(self, replica_id: str) -> None: ...


class ToxicClient(Protocol):
    """The control API of kvgate's proxy (harness.netproxy.client.ProxyClient), as the
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


class FaultSpec(BaseModel):
    """A plan's fault entry: when it fires, in seconds after the load starts, and what each
    kind declares about itself. A kind's model adds `kind: Literal["name"] = "name"` and its
    own keys (any other key is refused), and says what the fault does to its target."""

    model_config = ConfigDict(extra="forbid")

    # Set by the models whose faults act on kvgate's proxy in the traffic's path: a plan with
    # one gets the proxy, and its target must be plain http:// (the proxy forwards TCP).
    uses_proxy: ClassVar[bool] = False

    at_s: float = Field(ge=0)
    kind: str  # each kind's model narrows it: kind: Literal["name"] = "name"

    @abstractmethod
    def declared_effect(self) -> FaultEffect:
        """What this fault does to its target once applied (the faults row's `effect`)."""

    def admin_replica(self) -> str | None:
        """The replica this fault acts on through the admin API of a deployment kvgate runs
        (reference or vllm), checked against the plan's target; None for a kind that works
        on any target."""
        return None


@dataclass(frozen=True, slots=True)
class FaultKind:
    """One registered kind: its name, its plan entry's model and its action."""

    name: str
    spec: type[FaultSpec]
    action: ActionFactory


# Every kind registered so far, in registration order; harness.faults.registry exposes it.
KINDS: dict[str, FaultKind] = {}

ActionClass = TypeVar("ActionClass", bound=Callable[..., Any])


def fault_kind(*specs: type[FaultSpec]) -> Callable[[ActionClass], ActionClass]:
    """Register the decorated action class as the implementation of each kind whose plan
    model is in `specs` (one action may serve several kinds, as kill and kill_during_storm)."""
    for spec in specs:
        _check_spec(spec)

    def register(action: ActionClass) -> ActionClass:
        for spec in specs:
            name = spec.model_fields["kind"].default
            if name in KINDS:
                raise TypeError(
                    f"fault kind {name!r} is registered twice: by {KINDS[name].spec.__module__} "
                    f"and by {spec.__module__}; rename one of them"
                )
            KINDS[name] = FaultKind(name, spec, action)
        return action

    return register


def _check_spec(spec: type[FaultSpec]) -> None:
    if not (isinstance(spec, type) and issubclass(spec, FaultSpec)):
        raise TypeError(f"fault_kind takes the kinds' models, FaultSpec subclasses; got {spec!r}")
    where = f"{spec.__module__}.{spec.__qualname__}"
    kind = spec.model_fields.get("kind")
    if kind is None or not isinstance(kind.default, str):
        raise TypeError(f'{where}: give the model `kind: Literal["name"] = "name"`')
    if inspect.isabstract(spec):
        raise TypeError(f"{where}: say what the fault does: define declared_effect()")
