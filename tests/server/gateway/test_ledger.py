"""The global ledger: quota checks, one reservation per request, drift against replicas."""

from __future__ import annotations

import pytest

from server.gateway.ledger import Ledger, drift
from server.protocol import ApiError
from server.scheduler import Priority, TenantQuota

QUOTA = TenantQuota(
    name="acme",
    hard_reserved_tokens=1000,
    soft_reserved_tokens=500,
    max_active_seqs=3,
    max_context_tokens=800,
    max_gpu_seconds=10,
    budgets={Priority.INTERACTIVE: 800, Priority.BATCH: 300},
)
INTER, BATCH = Priority.INTERACTIVE, Priority.BATCH


def ledger() -> Ledger:
    return Ledger({"acme": QUOTA})


def test_hard_quota_and_budgets_and_sequences() -> None:
    lg = ledger()
    lg.check("acme", INTER, 700)
    lg.reserve("a", "acme", INTER, "r0", 700)
    with pytest.raises(ApiError) as exc:
        lg.check("acme", INTER, 200)  # 900 > interactive budget 800
    assert exc.value.status == 429 and exc.value.code == "tenant_quota"
    assert exc.value.headers["Retry-After"] == "2" and "800-token interactive" in exc.value.message
    lg.check("acme", BATCH, 300)
    lg.reserve("b", "acme", BATCH, "r1", 250)
    with pytest.raises(ApiError, match="1000-token quota"):
        lg.check("acme", BATCH, 60)  # 1010 > hard 1000
    lg.reserve("c", "acme", BATCH, "r1", 10)
    with pytest.raises(ApiError, match="3 active requests"):
        lg.check("acme", BATCH, 1)


def test_one_reservation_per_request_and_replica_death() -> None:
    lg = ledger()
    lg.reserve("a", "acme", INTER, "r0", 100)
    with pytest.raises(AssertionError):
        lg.reserve("a", "acme", INTER, "r1", 100)
    lg.reserve("b", "acme", INTER, "r1", 50)
    assert lg.by_replica() == {"r0": 100, "r1": 50}
    assert lg.drop_replica("r0") == 100
    lg.release("a", "r0")  # the relay's late release is harmless
    assert lg.by_replica() == {"r1": 50} and lg.tenant_tokens("acme") == 50
    lg.release("b", "r0")  # not its replica: kept
    assert lg.holds("b")
    headers = lg.quota_headers("acme")
    assert headers["X-Kvgate-Quota-Remaining-Tokens"] == "950"


def test_drift_ignores_requests_in_transit_but_not_leftovers() -> None:
    lg = ledger()
    lg.reserve("a", "acme", INTER, "r0", 100)
    lg.reserve("gone", "acme", INTER, "r1", 40)
    lg.reserve("tokenizing", "acme", INTER, "r1", 30)  # its replica has not answered yet
    for rid, rep in (("a", "r0"), ("gone", "r1")):
        lg.ack(rid, rep)
    before = lg.snapshot()
    lg.reserve("new", "acme", INTER, "r0", 7)  # started while we looked: skipped
    after = lg.snapshot()
    live = {"r0": {"a": 100, "new": 7}, "r1": {}}
    assert drift(before, after, live) == {
        "ledger_tokens": 140,
        "live_tokens": 100,
        "drift_tokens": 40,
    }
    live["r1"]["stray"] = 5  # a replica holds what the ledger never had
    assert drift(before, after, live)["drift_tokens"] == 35
    live["r1"]["tokenizing"] = 30  # queued on the replica before its answer: still skipped
    assert drift(before, after, live)["drift_tokens"] == 35
