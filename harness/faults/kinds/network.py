"""The `network` fault: a toxic on kvgate's proxy between the load generator and the target
(harness/faults/proxy.py puts the proxy in the traffic's path), for `duration_s`; the
rollback removes it.

A toxic that resets or stalls connections (reset_peer, timeout) breaks them: the gates do
not hold a connection that broke under it against the server. The others (latency,
bandwidth, slow_close) only slow the traffic, and excuse nothing: how the server's clients
fare over a slow network is what they are there to judge.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

import contract
from contract import FaultEffect
from harness.faults.base import (
    FaultContext,
    FaultError,
    FaultRecord,
    FaultSpec,
    ToxicClient,
    fault_kind,
)

CONTROL_LIMIT_S = 10.0  # a DELETE on the proxy's control API (its client times out at 5 s)
BREAKING_TOXICS = ("reset_peer", "timeout")  # they end or stall connections outright


class Toxic(BaseModel):
    """A toxic of kvgate's proxy (toxiproxy's types, attributes and streams)."""

    model_config = ConfigDict(extra="forbid")

    type: contract.ToxicType
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


class NetworkFault(FaultSpec):
    """A toxic on kvgate's proxy between the load generator and the target, for
    `duration_s`; the rollback removes it."""

    uses_proxy: ClassVar[bool] = True

    kind: Literal["network"] = "network"
    duration_s: float = Field(gt=0, le=86400)
    toxic: Toxic

    def declared_effect(self) -> FaultEffect:
        if self.toxic.type in BREAKING_TOXICS:
            return FaultEffect.BREAKS_CONNECTIONS
        return FaultEffect.DEGRADES_NETWORK


@fault_kind(NetworkFault)
class NetworkAction:
    """network: add the toxic to the proxy; the rollback removes it."""

    def __init__(self, spec: NetworkFault, context: FaultContext) -> None:
        if context.proxy is None:
            raise FaultError(
                "network faults need kvgate's proxy in the traffic's path, and this run "
                "has none (the orchestrator starts it for plans with a network fault)"
            )
        self.spec = spec
        self.proxy: ToxicClient = context.proxy
        self.target = "proxy"
        self.hold_s = spec.duration_s
        self.rollback_limit_s = CONTROL_LIMIT_S

    def apply(self, record: FaultRecord) -> None:
        toxic = self.spec.toxic
        name = record.params["toxic_name"] = f"kvgate-{record.fault_id}"
        try:
            self.proxy.add_toxic(
                name,
                toxic.type,
                dict(toxic.attributes),
                stream=toxic.stream,
                toxicity=toxic.toxicity,
            )
        except Exception as exc:  # the client's errors are its own; the row must say why
            with contextlib.suppress(Exception):
                self.proxy.remove_toxic(name)  # in case it was added before the error
            raise FaultError(f"the proxy did not add the {toxic.type} toxic: {exc}") from exc
        record.begin()

    def rollback(self, record: FaultRecord) -> None:
        name = record.params["toxic_name"]
        try:
            self.proxy.remove_toxic(name)
        except Exception as exc:
            raise FaultError(f"the proxy did not remove toxic {name}: {exc}") from exc
        record.rollback.append(f"removed toxic {name}")
