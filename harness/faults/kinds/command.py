"""The `command` fault: the user's shell command (docker kill, kubectl delete pod, systemctl
restart, a disk filler, a throttle ...) and its rollback command, each under a timeout, exit
code and output recorded.

kvgate cannot know what a command does, so the plan says it: `effect` (default `none`) is
what the command does to its target once it has exited 0. `docker kill` and `kubectl delete
pod` kill (`effect: kills`: the gates count the replica's death, and its reservations die
with it); a command that fills a disk or throttles a CPU kills nothing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from contract import FaultEffect
from harness.faults.base import FaultContext, FaultError, FaultRecord, FaultSpec, fault_kind
from harness.faults.shell import REAP_S, run_shell


class CommandFault(FaultSpec):
    """Run the user's shell command (docker kill, kubectl delete pod, systemctl restart ...),
    and its `rollback` command `rollback_after_s` later; a non-zero exit fails the fault."""

    kind: Literal["command"] = "command"
    command: str = Field(min_length=1)
    rollback: str | None = Field(None, min_length=1)
    rollback_after_s: float | None = Field(None, ge=0, le=3600)  # with a rollback; default 0
    timeout_s: float = Field(30.0, gt=0, le=3600)  # for each command; then it is killed
    target: str = Field("command", min_length=1)  # the faults row's target (e.g. a replica id)
    effect: FaultEffect = FaultEffect.NONE  # what the command does to `target` when it exits 0

    @model_validator(mode="after")
    def _rollback_given(self) -> CommandFault:
        if self.rollback is None and self.rollback_after_s is not None:
            raise ValueError("rollback_after_s needs a rollback command")
        if self.rollback is not None and self.rollback_after_s is None:
            self.rollback_after_s = 0.0
        return self

    def declared_effect(self) -> FaultEffect:
        return self.effect


@fault_kind(CommandFault)
class CommandAction:
    """command: run the command (the fault), then the rollback command `rollback_after_s`
    later; a non-zero exit or a timeout of either fails the fault."""

    def __init__(self, spec: CommandFault, context: FaultContext) -> None:
        self.spec = spec
        self.target = spec.target
        self.hold_s = spec.rollback_after_s or 0.0
        self.rollback_limit_s = spec.timeout_s + REAP_S

    def apply(self, record: FaultRecord) -> None:
        record.begin()  # the command may act at any moment of its run
        result = run_shell(self.spec.command, self.spec.timeout_s)
        record.params.update(result.params())
        if not result.ok:
            raise FaultError(f"command {result.describe()}")

    def rollback(self, record: FaultRecord) -> None:
        if self.spec.rollback is None:
            return
        result = run_shell(self.spec.rollback, self.spec.timeout_s)
        record.params.update(result.params("rollback_"))
        if not result.ok:
            raise FaultError(f"rollback command {result.describe()}")
        record.rollback.append("rollback command exited 0")
