"""The gateway's named bugs (server.scheduler.mutants has the scheduler's): subclasses of the
relay that the gateway builds instead of Relay when the deployment carries one."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from contract import Mutant
from server.gateway.relay import Relay, Routed
from server.gateway.supervisor import ReplicaProc


class DoubleHoldAfterFailover(Relay):
    """A request retried after its replica died stays reserved on the dead one too: the
    reservation is carried along instead of dropped, until the gateway restarts."""

    def _drop_hold(self, r: Routed, rep: ReplicaProc) -> None:
        super()._drop_hold(r, rep)
        stale = f"{r.key}@{rep.id}"
        self._ledger.reserve(stale, r.identity.tenant, r.identity.priority, rep.id, r.tokens)
        self._ledger.ack(stale, rep.id)


class WaitsForever(Relay):
    """The gateway's half of queue_instead_of_refuse: it waits as long as the replica keeps
    low-priority (replayable) work queued, with no limit on its response headers."""

    def _headers_timeout(self, r: Routed, timeout_s: float) -> float | None:
        return None if r.replayable else super()._headers_timeout(r, timeout_s)


RELAYS: Final[Mapping[Mutant, type[Relay]]] = MappingProxyType(
    {
        Mutant.DOUBLE_HOLD_AFTER_FAILOVER: DoubleHoldAfterFailover,
        Mutant.QUEUE_INSTEAD_OF_REFUSE: WaitsForever,
    }
)


def relay_class(mutant: Mutant | None) -> type[Relay]:
    """The relay to build for a deployment carrying `mutant` (Relay for most)."""
    return Relay if mutant is None else RELAYS.get(mutant, Relay)
