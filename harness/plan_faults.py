"""The plan's fault models: one per kind, joined as a union on `kind` (contract.FAULT_KINDS).

The replica kinds act through the reference gateway's admin API; signal, command and network
act on a process, a command of the user's, or kvgate's proxy, so they work on any target.
harness/faults/ carries them out; harness/README.md ("Faults") documents every field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import contract


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _FaultBase(_Strict):
    """What every fault has: when it fires, in seconds after the load starts."""

    at_s: float = Field(ge=0)


class KillFault(_FaultBase):
    """SIGKILL a reference replica; restart it through the gateway after a delay."""

    kind: Literal["kill"] = "kill"
    replica: str = "r0"
    restart_after_s: float = Field(5.0, ge=0, le=600)


class PauseFault(_FaultBase):
    """SIGSTOP a reference replica; SIGCONT after `duration_s`."""

    kind: Literal["pause"] = "pause"
    replica: str = "r0"
    duration_s: float = Field(2.0, gt=0, le=600)


class KillDuringStormFault(_FaultBase):
    """Wait for a cancellation storm (`min_cancels` in 2 s), then kill like `kill`."""

    kind: Literal["kill_during_storm"] = "kill_during_storm"
    replica: str = "r0"
    restart_after_s: float = Field(5.0, ge=0, le=600)
    storm_wait_s: float = Field(20.0, gt=0, le=600)  # how long to wait for the storm
    min_cancels: int = Field(3, ge=1)  # cancellations within 2 s


# A signal fault's restart fields: none of them means anything without a restart_command.
# They default to None and are filled in by the validator, so a dumped plan validates again.
_RESTART_KEYS = (
    "restart_command",
    "restart_after_s",
    "timeout_s",
    "wait_healthy_url",
    "healthy_timeout_s",
)


class SignalFault(_FaultBase):
    """Send a signal to one process of any deployment: by pid, pidfile or command line.

    The rollback of STOP is CONT after `duration_s`; of any other signal, the user's
    `restart_command` after `restart_after_s` (none given: no rollback)."""

    kind: Literal["signal"] = "signal"
    signal: Literal[contract.FAULT_SIGNALS]
    pid: int | None = Field(None, gt=1)
    pidfile: str | None = Field(None, min_length=1)  # read when the fault fires
    match: str | None = Field(None, min_length=1)  # a substring of exactly one command line
    target: str | None = None  # the row's target, e.g. r0; default pid:N, pidfile:P, match:M
    # The signal goes to the process and all its descendants (snapshotted first): a server
    # is often several processes, and a KILL of the parent alone leaves the others running.
    tree: bool = True
    duration_s: float | None = Field(None, gt=0, le=3600)  # STOP only; default 2
    restart_command: str | None = Field(None, min_length=1)  # a shell command
    restart_after_s: float | None = Field(None, ge=0, le=3600)  # default 5
    timeout_s: float | None = Field(None, gt=0, le=3600)  # restart_command's; default 60
    wait_healthy_url: str | None = None  # after the restart, poll until it answers 2xx
    healthy_timeout_s: float | None = Field(None, gt=0, le=3600)  # default 120

    @field_validator("signal", mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        """`SIGTERM`, `term` and `TERM` are one signal."""
        return value.upper().removeprefix("SIG") if isinstance(value, str) else value

    @model_validator(mode="after")
    def _coherent(self) -> SignalFault:
        given = [k for k in ("pid", "pidfile", "match") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of pid, pidfile or match (the process to signal); "
                f"got {', '.join(given) or 'none'}"
            )
        restart = [k for k in _RESTART_KEYS if getattr(self, k) is not None]
        if self.signal == "STOP":
            if restart:
                raise ValueError(
                    f"{', '.join(restart)}: a STOP is rolled back by CONT after duration_s; "
                    "restarts are for the other signals"
                )
            self.duration_s = 2.0 if self.duration_s is None else self.duration_s
            return self
        if self.duration_s is not None:
            raise ValueError(
                f"duration_s applies to STOP only (CONT follows it); after {self.signal}, "
                "give restart_command and restart_after_s"
            )
        if self.restart_command is None and restart:
            raise ValueError(f"{', '.join(restart)}: need a restart_command")
        url = self.wait_healthy_url
        if url is None and self.healthy_timeout_s is not None:
            raise ValueError("healthy_timeout_s needs a wait_healthy_url")
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"wait_healthy_url must start with http:// or https://, got {url!r}")
        if self.restart_command is not None:
            self.restart_after_s = 5.0 if self.restart_after_s is None else self.restart_after_s
            self.timeout_s = 60.0 if self.timeout_s is None else self.timeout_s
        if url is not None and self.healthy_timeout_s is None:
            self.healthy_timeout_s = 120.0
        return self


class CommandFault(_FaultBase):
    """Run the user's shell command (docker kill, kubectl delete pod, systemctl restart ...),
    and its `rollback` command `rollback_after_s` later; a non-zero exit fails the fault."""

    kind: Literal["command"] = "command"
    command: str = Field(min_length=1)
    rollback: str | None = Field(None, min_length=1)
    rollback_after_s: float | None = Field(None, ge=0, le=3600)  # with a rollback; default 0
    timeout_s: float = Field(30.0, gt=0, le=3600)  # for each command; then it is killed
    target: str = Field("command", min_length=1)  # the faults row's target (e.g. a replica id)

    @model_validator(mode="after")
    def _rollback_given(self) -> CommandFault:
        if self.rollback is None and self.rollback_after_s is not None:
            raise ValueError("rollback_after_s needs a rollback command")
        if self.rollback is not None and self.rollback_after_s is None:
            self.rollback_after_s = 0.0
        return self


class Toxic(_Strict):
    """A toxic of kvgate's proxy (toxiproxy's types, attributes and streams)."""

    type: Literal[contract.TOXIC_TYPES]
    attributes: dict[str, float] = Field(default_factory=dict)
    stream: Literal["downstream", "upstream"] = "downstream"
    toxicity: float = Field(1.0, ge=0, le=1)  # the share of connections it applies to

    @model_validator(mode="after")
    def _attributes_fit(self) -> Toxic:
        allowed = contract.TOXIC_ATTRIBUTES[self.type]
        unknown = sorted(set(self.attributes) - set(allowed))
        if unknown:
            raise ValueError(
                f"{self.type}: unknown attribute(s) {', '.join(unknown)}; "
                f"allowed: {', '.join(allowed)}"
            )
        negative = sorted(k for k, v in self.attributes.items() if v < 0)
        if negative:
            raise ValueError(f"{self.type}: attribute(s) {', '.join(negative)} must be >= 0")
        needed = {"latency": "latency", "bandwidth": "rate"}.get(self.type)
        if needed and not self.attributes.get(needed):
            raise ValueError(f"{self.type}: give attributes.{needed} (> 0)")
        return self


class NetworkFault(_FaultBase):
    """A toxic on kvgate's proxy between the load generator and the target, for
    `duration_s`; the rollback removes it."""

    kind: Literal["network"] = "network"
    duration_s: float = Field(gt=0, le=86400)
    toxic: Toxic


FAULT_MODELS = {
    model.model_fields["kind"].default: model
    for model in (
        KillFault,
        PauseFault,
        KillDuringStormFault,
        SignalFault,
        CommandFault,
        NetworkFault,
    )
}
FaultSpec = (
    KillFault | PauseFault | KillDuringStormFault | SignalFault | CommandFault | NetworkFault
)
Fault = Annotated[FaultSpec, Field(discriminator="kind")]
