"""Preemption: the 8-request scenario V was designed on, V's two fixes, the tier order."""

from __future__ import annotations

import math

import pytest

from server.scheduler import Decision, Priority, RejectCode, Scheduler, SeqState
from server.scheduler.sequence import Sequence
from server.scheduler.victims import value, victim_order
from tests.server.scheduler.helpers import FakeClock, quota, req, small_config, step, tenants

MIB = 1 << 20


def scenario_scheduler() -> tuple[Scheduler, FakeClock]:
    """Llama-3-70B at exactly 320 KiB/token: 16-token blocks of 5 MiB, 19 GiB = 3891 blocks;
    the hard watermark is 3579 blocks. One traffic class (batch, not replayable) so the value
    function alone picks the victim; interactive_reserve 0 lets that class use the pool."""
    cfg = small_config(
        model="llama-3-70b",
        overhead_factor=1.0,
        safety_factor=1.0,
        kv_pool_gib=19.0,
        step_token_budget=2048,
        interactive_reserve=0.0,
        long_request_tokens=10**6,
    )
    clock = FakeClock()
    return Scheduler(cfg, tenants("app", "sys"), clock=clock), clock


def test_seed_001_scenario_preempts_the_fresh_8gb_prefill() -> None:
    s, clock = scenario_scheduler()
    # Four 256 MiB requests (819 tokens), three 2 GiB (6554 tokens), admitted first.
    for i in range(4):
        s.submit(req(f"short{i}", "app", Priority.BATCH, prompt=819, max_new=181))
    for i in range(3):
        s.submit(req(f"mid{i}", "app", Priority.BATCH, prompt=6554, max_new=446))
    while any(s.prefilling.values()):
        step(s, clock, dt=0.05)
    # The 32K-context request: 8 GiB of prompt (26214 tokens), prefilled over 3.5 s while
    # the seven others keep decoding.
    s.submit(req("big", "app", Priority.BATCH, prompt=26214, max_new=5000))
    prefill_steps = math.ceil(26214 / (2048 - 7))
    for _ in range(prefill_steps):
        step(s, clock, dt=3.5 / prefill_steps)
    assert s.generated_tokens("big") == 1  # prefill done: it just produced its first token
    held_mib = {q.request_id: q.held_tokens * 320 / 1024 for q in s.running()}
    assert round(held_mib["short0"] / 256) == 1 and round(held_mib["mid0"] / 2048) == 1
    assert round(held_mib["big"] / 8192) == 1
    committed = s.committed_blocks / s.pool_blocks
    assert 0.90 < committed <= s.config.hard_watermark  # memory at the high watermark

    # A critical request arrives; critical work may commit past the hard watermark, and the
    # next step must reclaim the excess by preempting recoverable work.
    crit = s.submit(req("crit", "sys", Priority.CRITICAL, prompt=2000, max_new=1000))
    assert crit.outcome is Decision.ADMIT
    assert s.committed_blocks > s.config.hard_watermark * s.pool_blocks
    big = s.running_seq("big")
    assert big is not None
    gpu_before, deadline_before = s.gpu_seconds("big"), big.deadline
    values = {
        q.request_id: value(q, clock(), s.config.bytes_per_token, 0.5, False)
        for q in s.running()
        if q.priority is Priority.BATCH
    }
    plan = step(s, clock)

    # Why "big": V protects age, size and progress. Its flaw was counting prefill
    # time as age, which made a request that spent 3.5 s in prefill look old and safe — yet
    # that request is the one that caused the pressure. With age = decode time only, "big"
    # is the youngest decoder (age ~0 ms) and has no progress; its 8 GiB size term (2.25)
    # cannot outweigh the ~4 s of decode age (about 2.5) the others have earned.
    assert plan.preempted == ("big",)
    assert min(values, key=values.__getitem__) == "big"
    # One victim is enough; a 256 MiB request (63 blocks) could not have covered the excess.
    assert s.committed_blocks <= s.config.hard_watermark * s.pool_blocks
    # Under the flawed age (time since submit, prefill included) the victim would have been
    # a short request instead: the culprit would have been protected.
    flawed = {
        q.request_id: values[q.request_id]
        + 0.3 * (math.log1p((clock() - q.t_submit) * 1000))
        - 0.3 * math.log1p(q.decode_age(clock()) * 1000)
        for q in [*s.running(), big]
        if q.request_id in values
    }
    assert min(flawed, key=flawed.__getitem__).startswith("short")

    # The victim keeps its deadline, GPU time and counters, and waits at its arrival spot.
    assert s.state("big") is SeqState.PREEMPTED
    assert s.gpu_seconds("big") == gpu_before and big.deadline == deadline_before
    assert (big.preemptions, big.recomputes, big.generated) == (1, 0, 1)
    assert s.kv.pool.used == sum(len(q.blocks) for q in s.running())


def test_preempted_request_resumes_recomputes_and_finishes() -> None:
    s, clock = scenario_scheduler()
    s.submit(req("victim", "app", Priority.BATCH, prompt=20000, max_new=30))
    s.submit(req("other", "app", Priority.BATCH, prompt=20000, max_new=30))
    while any(s.prefilling.values()):
        step(s, clock)
    step(s, clock)
    s.preempt(s.running_seq("other") or pytest.fail("other not running"), "test")
    gen = s.generated_tokens("other")
    seq = s._lookup("other")
    assert seq is not None
    gpu = s.gpu_seconds("other")
    s.drain_events()
    events = []
    while s.state("other") is not SeqState.FINISHED:
        step(s, clock)
        events += [e.event for e in s.drain_events() if e.request_id == "other"]
        if seq.state is SeqState.RECOMPUTING:
            assert seq.generated == gen  # output so far is kept; only KV is rebuilt
    assert events[:1] == ["resumed"] and events[-2:] == ["finished", "released"]
    assert seq.recomputes == 1 and seq.preemptions == 1 and s.gpu_seconds("other") > gpu
    assert s.generated_tokens("other") == 30


def _seq(rid: str, prio: Priority, prompt: int, generated: int, age_s: float) -> Sequence:
    seq = Sequence(req(rid, priority=prio, prompt=prompt), 1, 100, 10, [], True, 0.0, 8.0)
    seq.kv_tokens = prompt + generated
    seq.generated = generated
    seq.t_decode_start = 100.0 - age_s
    return seq


def test_value_function_terms_and_protection_bonus() -> None:
    seq = _seq("x", Priority.INTERACTIVE, 1000, 100, 2.0)
    size_mb = 1100 * 131072 / MIB
    expected = (
        0.3 * math.log1p(2000.0) + 0.25 * (100 / 1101) + 0.25 * math.log1p(size_mb) - 0.2 * 0.6
    )
    assert value(seq, 100.0, 131072, 0.5, False) == pytest.approx(expected)
    seq.preemptions = 1
    assert value(seq, 100.0, 131072, 0.5, False) == pytest.approx(expected + 0.5)
    assert value(seq, 100.0, 131072, 0.5, True) == pytest.approx(expected)  # overage -0.5


def test_protection_bonus_spares_a_request_preempted_before() -> None:
    s, clock = scenario_scheduler()
    for rid in ("a", "b"):
        s.submit(req(rid, "app", Priority.BATCH, prompt=12000, max_new=8000))
    while any(s.prefilling.values()):
        step(s, clock)
    for _ in range(20):  # 2 s of decoding: their ages now differ by a few percent only
        step(s, clock, dt=0.1)
    a, b = s.running_seq("a"), s.running_seq("b")
    assert a is not None and b is not None
    now = clock()
    va, vb = (value(q, now, s.config.bytes_per_token, 0.5, False) for q in (a, b))
    younger, older = (a, b) if va < vb else (b, a)
    younger.preemptions = 1  # it already paid once: now the other one goes first
    s.submit(req("crit", "sys", Priority.CRITICAL, prompt=12000, max_new=7200))
    plan = step(s, clock)
    assert plan.preempted == (older.request_id,)


def test_tier_order_replayable_batch_then_value_streamed_only_at_risk() -> None:
    clock = FakeClock()
    s = Scheduler(
        small_config(kv_pool_gib=4.0, step_token_budget=1024, interactive_reserve=0.0),
        tenants("a", "sys"),
        clock=clock,
    )
    s.submit(req("inter", "a", Priority.INTERACTIVE, prompt=4000, max_new=2000))
    s.submit(req("replay", "a", Priority.BATCH, prompt=4000, max_new=2000, replayable=True))
    s.submit(req("plain", "a", Priority.BATCH, prompt=4000, max_new=2000))
    while any(s.prefilling.values()):
        step(s, clock)
    # commitments: 3 x 375 = 1125 of 1773; a critical request of 600 blocks pushes them over
    # the hard watermark (1631) by 94 blocks: one victim is enough.
    s.submit(req("crit", "sys", Priority.CRITICAL, prompt=6000, max_new=3600))
    assert step(s, clock).preempted == ("replay",)  # tier 3 before any value comparison
    s.submit(req("crit2", "sys", Priority.CRITICAL, prompt=4000, max_new=2000))
    assert step(s, clock).preempted == ("plain",)  # tier 4 next; streamed "inter" spared
    # 300 more blocks would pass the hard line with no batch work left to pay them back:
    # the critical request waits rather than preempt a streamed interactive session.
    crit3 = s.submit(req("crit3", "sys", Priority.CRITICAL, prompt=3000, max_new=1800))
    assert crit3.outcome is Decision.QUEUE
    assert step(s, clock).preempted == ()
    assert not s.at_risk and s.state("inter") is SeqState.RUNNING
    s.cancel("crit")
    assert step(s, clock).admitted[0] == "crit3"  # first in line once room frees


def test_tier_2_sheds_queued_requests_of_tenants_over_soft_quota() -> None:
    clock = FakeClock()
    quotas = {
        "greedy": quota("greedy", soft_reserved_tokens=1000),
        "sys": quota("sys"),
        "fill": quota("fill"),
    }
    s = Scheduler(small_config(), quotas, clock=clock)  # 443 blocks, hard line 407
    s.submit(req("g1", "greedy", prompt=1000, max_new=600))  # 100 blocks, over soft quota
    for i in range(3):  # batch work: what lets a critical request past the hard line
        s.submit(req(f"f{i}", "fill", Priority.BATCH, prompt=1000, max_new=600))
    assert s.submit(req("g2", "greedy", prompt=500, max_new=100)).outcome is Decision.QUEUE
    assert s.submit(req("f9", "fill", prompt=500, max_new=100)).outcome is Decision.QUEUE
    s.submit(req("crit", "sys", Priority.CRITICAL, prompt=300, max_new=100))
    plan = step(s, clock)
    shed = dict(plan.expired)
    assert list(shed) == ["g2"]
    assert shed["g2"].reason is RejectCode.TENANT_QUOTA and shed["g2"].http_status == 429
    assert "soft quota" in shed["g2"].message
    assert s.state("f9") is SeqState.WAITING
    assert s.stats().evictions["soft_quota_queued"] == 1
    # Then tier 4: g1 has streamed nothing yet and its tenant's soft overage lowers its value.
    assert plan.preempted == ("g1",)


def test_victim_order_walks_tiers_and_streamed_only_when_allowed() -> None:
    streamed = _seq("streamed", Priority.INTERACTIVE, 100, 5, 0.1)
    crit = _seq("crit", Priority.CRITICAL, 100, 0, 0.0)
    plain = _seq("plain", Priority.BATCH, 5000, 500, 60.0)  # old and large: high V
    replay = _seq("replay", Priority.BATCH, 10, 1, 0.0)
    replay.req = req("replay", priority=Priority.BATCH, replayable=True)
    fresh = _seq("fresh", Priority.INTERACTIVE, 100, 0, 0.0)  # nothing streamed yet
    for i, q in enumerate((streamed, crit, plain, replay, fresh)):
        q.arrival = i

    def order(allow: bool) -> list[str]:
        return [
            q.request_id
            for q in victim_order(
                [streamed, crit, plain, replay, fresh], 100.0, 131072, 0.5, lambda t: False, allow
            )
        ]

    assert order(False) == ["replay", "fresh", "plain"]
    assert order(True)[:3] == ["replay", "fresh", "plain"]
    assert set(order(True)[3:]) == {"streamed", "crit"}
