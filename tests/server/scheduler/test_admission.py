"""Admission: the three outcomes, every rejection reason, and the messages people read."""

from __future__ import annotations

from server.scheduler import Decision, Priority, RejectCode, Scheduler, SeqState
from tests.server.scheduler.helpers import (
    FakeClock,
    check_invariants,
    quota,
    req,
    small_config,
    step,
    tenants,
)

# small_config: 443 blocks; a 1000 + 600 token request needs 100 blocks; non-critical work
# may commit up to 0.92 x 443 = 407 blocks, so four such requests fit and the fifth queues.


def make(**cfg: object) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    return Scheduler(small_config(**cfg), tenants("a", "b"), clock=clock), clock


def fill(s: Scheduler, n: int = 4, tenant: str = "b") -> None:
    for i in range(n):
        assert s.submit(req(f"fill{tenant}{i}", tenant, prompt=1000, max_new=600)).outcome is (
            Decision.ADMIT
        )


def test_admit_now_applies_default_max_tokens() -> None:
    s, _ = make(max_new_tokens_default=777)
    verdict = s.submit(req("r1", max_new=None))
    assert (verdict.outcome, verdict.http_status, verdict.reason) == (Decision.ADMIT, 200, None)
    assert verdict.max_new_tokens == 777
    assert s.state("r1") is SeqState.RUNNING
    assert s.kv.ledger.accounts["a"].reserved_tokens == 32 + 777


def test_queue_with_deadline_when_pool_is_committed() -> None:
    s, clock = make()
    fill(s)
    verdict = s.submit(req("late", prompt=1000, max_new=600))
    assert verdict.outcome is Decision.QUEUE and verdict.http_status == 200
    assert verdict.deadline == clock.t + 8.0
    assert s.state("late") is SeqState.WAITING
    assert [e.event for e in s.drain_events()][-1] == "queued"


def test_queued_request_starts_when_capacity_frees() -> None:
    s, clock = make()
    fill(s)
    s.submit(req("late", prompt=1000, max_new=600))
    step(s, clock)
    assert s.state("late") is SeqState.WAITING
    s.cancel("fillb0")
    plan = step(s, clock)
    assert plan.admitted == ("late",)
    assert s.state("late") is SeqState.RUNNING


def test_reject_capacity_when_queue_is_full() -> None:
    s, _ = make(max_queued=2)
    fill(s)
    for i in range(2):
        assert s.submit(req(f"q{i}", prompt=1000, max_new=600)).outcome is Decision.QUEUE
    verdict = s.submit(req("over", prompt=1000, max_new=600))
    assert (verdict.outcome, verdict.reason, verdict.http_status) == (
        Decision.REJECT,
        RejectCode.CAPACITY,
        503,
    )
    assert verdict.retry_after_s is not None and verdict.retry_after_s >= 1
    assert "queue holds 2 requests" in verdict.message
    assert len(s.queue) == 2


def test_reject_deadline_expired_on_the_step_after_the_deadline() -> None:
    s, clock = make()
    fill(s)
    assert s.submit(req("late", prompt=1000, max_new=600, deadline_ms=500)).outcome is (
        Decision.QUEUE
    )
    clock.advance(0.4)
    assert step(s, clock).expired == ()
    clock.advance(0.2)
    plan = step(s, clock)
    assert [rid for rid, _ in plan.expired] == ["late"]
    verdict = plan.expired[0][1]
    assert (verdict.reason, verdict.http_status) == (RejectCode.DEADLINE_EXPIRED, 503)
    assert verdict.retry_after_s is not None
    assert s.state("late") is SeqState.FINISHED
    assert s.stats().rejected_requests[("deadline_expired", "interactive", "a")] == 1


def test_reject_too_long_for_tenant_context_with_actionable_message() -> None:
    clock = FakeClock()
    s = Scheduler(small_config(), {"a": quota("a", max_context_tokens=32768)}, clock=clock)
    verdict = s.submit(req("long", prompt=32000, max_new=1024))
    assert (verdict.reason, verdict.http_status, verdict.retry_after_s) == (
        RejectCode.TOO_LONG,
        400,
        None,
    )
    assert verdict.message == (
        "input plus max_tokens exceeds your tenant's 32768-token context limit; shorten the "
        "input or lower max_tokens"
    )


def test_reject_too_long_for_model_context_and_for_the_pool() -> None:
    s, _ = make()
    verdict = s.submit(req("huge", prompt=131000, max_new=1024))
    assert verdict.reason is RejectCode.TOO_LONG
    assert "131072-token context of llama-3-8b" in verdict.message
    # 7000 tokens = 438 blocks: more than 0.92 x 443 = 407 blocks one request may commit.
    verdict = s.submit(req("fat", prompt=6000, max_new=1000))
    assert verdict.reason is RejectCode.TOO_LONG
    assert "438 KV blocks" in verdict.message and "(407 blocks)" in verdict.message


def test_reject_priority_not_allowed() -> None:
    clock = FakeClock()
    only_batch = {"a": quota("a", budgets={Priority.BATCH: 10**6})}
    s = Scheduler(small_config(), only_batch, clock=clock)
    verdict = s.submit(req("x", priority=Priority.CRITICAL))
    assert (verdict.reason, verdict.http_status) == (RejectCode.PRIORITY_NOT_ALLOWED, 403)
    assert "may not send critical traffic" in verdict.message
    assert s.submit(req("y", tenant="stranger")).reason is RejectCode.PRIORITY_NOT_ALLOWED


def test_reject_tenant_quota_each_limit() -> None:
    clock = FakeClock()
    limits = {
        "hard": quota("hard", hard_reserved_tokens=100, soft_reserved_tokens=50),
        "budget": quota("budget", budgets={Priority.INTERACTIVE: 60}),
        "seqs": quota("seqs", max_active_seqs=1),
        "gpu": quota("gpu", max_gpu_seconds=0.001),
    }
    s = Scheduler(small_config(), limits, clock=clock)
    for tenant, prompt, needle in [
        ("hard", 50, "hard quota of 100"),
        ("budget", 32, "interactive budget is 60"),
        ("seqs", 32, "limit is 1"),
    ]:
        first = req(f"{tenant}1", tenant, prompt=prompt, max_new=8)
        assert s.submit(first).outcome is Decision.ADMIT
        verdict = s.submit(req(f"{tenant}2", tenant, prompt=prompt, max_new=8))
        assert (verdict.reason, verdict.http_status) == (RejectCode.TENANT_QUOTA, 429), tenant
        assert needle in verdict.message
        assert verdict.retry_after_s is not None and verdict.retry_after_s >= 1
    s = Scheduler(small_config(), {"gpu": limits["gpu"]}, clock=clock)
    assert s.submit(req("gpu1", "gpu")).outcome is Decision.ADMIT
    step(s, clock, dt=1.0)
    assert s.kv.ledger.gpu_seconds("gpu") == 1.0
    verdict = s.submit(req("gpu2", "gpu"))
    assert verdict.reason is RejectCode.TENANT_QUOTA and "GPU seconds" in verdict.message


def test_tenant_share_cap_rejects_and_is_never_exceeded() -> None:
    clock = FakeClock()
    s = Scheduler(small_config(tenant_max_share=0.5), tenants("a", "b"), clock=clock)
    cap = int(0.5 * s.pool_blocks)  # 221 blocks
    assert s.submit(req("a1", prompt=1000, max_new=600)).outcome is Decision.ADMIT
    assert s.submit(req("a2", prompt=1000, max_new=600)).outcome is Decision.ADMIT
    verdict = s.submit(req("a3", prompt=1000, max_new=600))
    assert verdict.reason is RejectCode.TENANT_QUOTA
    assert "per-tenant share of the pool (221 blocks)" in verdict.message
    assert s.kv.ledger.accounts["a"].commit_blocks <= cap
    assert s.submit(req("b1", "b", prompt=1000, max_new=600)).outcome is Decision.ADMIT
    check_invariants(s)


def test_interactive_reserve_keeps_batch_out_of_a_quarter_of_the_pool() -> None:
    s, _ = make()
    outcomes = [
        s.submit(req(f"b{i}", priority=Priority.BATCH, prompt=900, max_new=700)).outcome
        for i in range(4)
    ]
    # 100 blocks each; batch may commit 0.75 x 443 = 332 blocks: three start.
    assert outcomes == [Decision.ADMIT] * 3 + [Decision.QUEUE]
    assert s.submit(req("i", prompt=900, max_new=700)).outcome is Decision.ADMIT


def test_rejections_are_counted_with_tokens() -> None:
    s, _ = make()
    s.submit(req("huge", prompt=131000, max_new=1024))
    stats = s.stats()
    assert stats.rejected_requests == {("too_long", "interactive", "a"): 1}
    assert stats.rejected_tokens == {"too_long": 132024}
    events = s.drain_events()
    assert [(e.event, e.reason) for e in events] == [("rejected", "too_long")]
