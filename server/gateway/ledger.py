"""The global tenant ledger: what every in-flight request has reserved, on which replica.

The unit is the quota's "reserved tokens" = input + output still allowed, which stays
prompt + max_new_tokens for a request's whole life (output used moves from one side of the sum
to the other). Replicas report the same number per request, so the two can be compared.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, replace

from server.protocol import ApiError
from server.scheduler import Priority, TenantQuota

QUOTA_RETRY_AFTER_S = 2.0


@dataclass(frozen=True, slots=True)
class Reservation:
    request_id: str
    tenant: str
    priority: Priority
    replica: str
    tokens: int
    t: float
    # The replica took the request (its response began). Until then the request is in
    # transit — in the replica's tokenizer queue or its wait queue — and drift checks skip it.
    acked: bool = False


class Ledger:
    """Reservations by request id. Invariant: a request id holds at most one reservation, so
    it can never be counted on two replicas; totals are recomputed from the entries, never
    kept as separate counters that could drift."""

    def __init__(self, quotas: dict[str, TenantQuota]) -> None:
        self._quotas = quotas
        self._entries: dict[str, Reservation] = {}

    def check(self, tenant: str, priority: Priority, tokens: int) -> None:
        """ApiError(429 tenant_quota) when reserving `tokens` more would break a hard limit."""
        quota = self._quotas[tenant]
        held = self.tenant_tokens(tenant)
        if held + tokens > quota.hard_reserved_tokens:
            raise _quota_error(
                f"tenant '{tenant}' holds {held} reserved tokens of its "
                f"{quota.hard_reserved_tokens}-token quota and this request needs {tokens}; "
                f"retry later or lower max_tokens"
            )
        budget = quota.budget(priority)
        in_class = sum(
            e.tokens
            for e in self._entries.values()
            if e.tenant == tenant and e.priority == priority
        )
        if in_class + tokens > budget:
            raise _quota_error(
                f"tenant '{tenant}' holds {in_class} reserved tokens of its {budget}-token "
                f"{priority.value} budget and this request needs {tokens}; retry later or lower "
                f"max_tokens"
            )
        active = self.tenant_sequences(tenant)
        if active >= quota.max_active_seqs:
            raise _quota_error(
                f"tenant '{tenant}' already has {active} active requests, its limit; retry when "
                f"one finishes"
            )

    def reserve(
        self, request_id: str, tenant: str, priority: Priority, replica: str, tokens: int
    ) -> Reservation:
        """Record a reservation; a second one for the same id is a bug, not a client error."""
        assert request_id not in self._entries, f"{request_id} already holds a reservation"
        entry = Reservation(request_id, tenant, priority, replica, tokens, time.time())
        self._entries[request_id] = entry
        return entry

    def holds(self, request_id: str) -> bool:
        return request_id in self._entries

    def ack(self, request_id: str, replica: str) -> None:
        """The replica answered for the id's reservation (idempotent)."""
        entry = self._entries.get(request_id)
        if entry is not None and entry.replica == replica and not entry.acked:
            self._entries[request_id] = replace(entry, acked=True)

    def release(self, request_id: str, replica: str) -> None:
        """Drop the id's reservation if it is still the one on `replica` (idempotent)."""
        entry = self._entries.get(request_id)
        if entry is not None and entry.replica == replica:
            del self._entries[request_id]

    def drop_replica(self, replica: str) -> int:
        """A replica died: every reservation on it is gone. Returns tokens dropped."""
        gone = [e for e in self._entries.values() if e.replica == replica]
        for e in gone:
            del self._entries[e.request_id]
        return sum(e.tokens for e in gone)

    def tenant_tokens(self, tenant: str) -> int:
        return sum(e.tokens for e in self._entries.values() if e.tenant == tenant)

    def tenant_sequences(self, tenant: str) -> int:
        return sum(1 for e in self._entries.values() if e.tenant == tenant)

    def by_tenant(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for e in self._entries.values():
            out[e.tenant] += e.tokens
        return dict(out)

    def by_replica(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for e in self._entries.values():
            out[e.replica] += e.tokens
        return dict(out)

    def snapshot(self) -> dict[str, Reservation]:
        return dict(self._entries)

    def quota_headers(self, tenant: str) -> dict[str, str]:
        limit = self._quotas[tenant].hard_reserved_tokens
        held = self.tenant_tokens(tenant)
        return {
            "X-Kvgate-Quota-Reserved-Tokens": str(held),
            "X-Kvgate-Quota-Limit-Tokens": str(limit),
            "X-Kvgate-Quota-Remaining-Tokens": str(max(limit - held, 0)),
        }


def _quota_error(message: str) -> ApiError:
    return ApiError(429, "tenant_quota", message, retry_after_s=QUOTA_RETRY_AFTER_S)


def drift(
    before: dict[str, Reservation],
    after: dict[str, Reservation],
    live: dict[str, dict[str, int]],
) -> dict[str, int]:
    """Ledger minus what live replicas hold, robust to requests in transit.

    `before`/`after` are ledger snapshots taken around the replicas' answers `live`
    (replica -> request id -> tokens). Ids present in only one ledger snapshot were starting
    or ending while we looked, and ids their replica has not yet answered for are still in
    transit (a 32K-token prompt can wait seconds for the replica's tokenizer under load):
    both are skipped. A stable, answered id the replica does not hold (or holds with another
    count, or on another replica) is drift, as is a live id the ledger never had.
    """
    stable = {i for i in before.keys() & after.keys() if before[i].acked and after[i].acked}
    seen = before.keys() | after.keys()
    ledger_tokens = sum(after[i].tokens for i in stable)
    live_tokens = 0
    for replica_live in live.values():
        for rid, tokens in replica_live.items():
            if rid in stable or rid not in seen:
                live_tokens += tokens
    return {
        "ledger_tokens": ledger_tokens,
        "live_tokens": live_tokens,
        "drift_tokens": ledger_tokens - live_tokens,
    }
