"""Baseline policies behind the same interface: naive, vllm, tgi (and how the seed differs)."""

from __future__ import annotations

import pytest

import contract
from server.scheduler import Decision, Priority, Scheduler, SeqState
from server.scheduler.policies import POLICIES, NaivePolicy, SeedPolicy, policy_registry
from tests.server.scheduler.helpers import FakeClock, req, small_config, step, tenants

GIB = 1 << 30


def make(policy: str, device_free_bytes: int | None = None) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    cfg = small_config(kv_pool_gib=4.0, step_token_budget=1024)
    scheduler = Scheduler(
        cfg, tenants("a"), policy=policy, clock=clock, device_free_bytes=device_free_bytes
    )
    return scheduler, clock


def long_context_load(s: Scheduler, n: int = 12) -> list[Decision]:
    return [s.submit(req(f"r{i}", prompt=4000, max_new=2000)).outcome for i in range(n)]


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="choose one of seed, vllm, tgi, naive"):
        make("fifo")


def test_the_policies_are_the_contracts_names_each_with_its_class() -> None:
    """contract.POLICIES is what plans and --policy offer; the scheduler's registry is built
    from it, so a name without a class (or a class the contract does not name) stops the
    server at import, not a run half-way."""
    assert tuple(POLICIES) == contract.POLICIES
    assert all(POLICIES[name].name == name for name in contract.POLICIES)
    classes = (SeedPolicy, NaivePolicy)
    with pytest.raises(TypeError, match=r"no policy class is named 'tgi'.*PolicyName"):
        policy_registry(classes, names=("seed", "naive", "tgi"))
    with pytest.raises(TypeError, match=r"contract.POLICIES does not name 'naive'"):
        policy_registry(classes, names=("seed",))


def test_naive_needs_device_free_bytes() -> None:
    with pytest.raises(ValueError, match="device_free_bytes"):
        make("naive")


def test_naive_admits_everything_and_fills_all_free_memory() -> None:
    s, clock = make("naive", device_free_bytes=6 * GIB)
    assert s.pool_blocks == 6 * GIB // s.config.block_bytes  # not kv_pool_gib
    assert long_context_load(s) == [Decision.ADMIT] * 12
    for _ in range(60):
        plan = step(s, clock)
        assert plan.preempted == ()
    # KV alone now holds every byte left after weights: no room for activations, so a real
    # (or simulated) GPU runs out of memory here.
    assert s.kv.pool.used * s.config.block_bytes > 0.99 * 6 * GIB
    assert all(s.state(f"r{i}") is SeqState.RUNNING for i in range(12))


def test_seed_under_the_same_load_stays_under_the_hard_watermark() -> None:
    s, clock = make("seed")
    outcomes = long_context_load(s)
    assert outcomes.count(Decision.ADMIT) == 4 and outcomes.count(Decision.QUEUE) == 8
    for _ in range(60):
        step(s, clock)
        assert s.committed_blocks <= s.config.hard_watermark * s.pool_blocks


def test_vllm_is_fcfs_and_preempts_the_newest_when_blocks_run_out() -> None:
    s, clock = make("vllm")
    # No worst-case reservation: each start needs only its prompt's blocks (250 + 1 slot).
    assert long_context_load(s, 7) == [Decision.ADMIT] * 7
    crit = s.submit(req("crit", priority=Priority.CRITICAL, prompt=4000, max_new=10))
    assert crit.outcome is Decision.QUEUE  # FCFS: priority does not jump the queue
    preempted: list[str] = []
    for _ in range(400):
        preempted += step(s, clock).preempted
        if preempted:
            break
    assert preempted == ["r6"]  # the newest running sequence
    assert s.state("r6") is SeqState.PREEMPTED


def test_vllm_ignores_tenant_quotas() -> None:
    s, _ = make("vllm")
    assert s.submit(req("x", tenant="nobody")).outcome is Decision.ADMIT


def test_tgi_reserves_full_max_tokens_never_preempts_and_queues_without_bound() -> None:
    s, clock = make("tgi")
    outcomes = long_context_load(s, 40)  # max_queued is 16: TGI's queue ignores it
    assert outcomes.count(Decision.ADMIT) == 4  # 4 x 375 blocks of 1773 reserved
    assert outcomes.count(Decision.QUEUE) == 36
    assert s.committed_blocks == 4 * 375
    clock.advance(60.0)  # far past any queue deadline
    for _ in range(30):
        plan = step(s, clock)
        assert plan.preempted == () and plan.expired == ()
    assert len(s.queue) == 36


def reserve_scheduler(reserve: float) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    cfg = small_config(kv_pool_gib=4.0, step_token_budget=1024, critical_reserve=reserve)
    return Scheduler(cfg, tenants("a", "sys"), policy="seed", clock=clock), clock


def fill_interactive(s: Scheduler) -> None:
    """Interactive requests of 4 blocks until one queues: the pool is committed for them."""
    for i in range(10_000):
        if s.submit(req(f"i{i}", prompt=40, max_new=24)).outcome is Decision.QUEUE:
            return
    raise AssertionError("the pool never filled")


def test_seed_keeps_the_critical_reserve_free_of_interactive_work() -> None:
    s, _ = reserve_scheduler(0.05)
    fill_interactive(s)
    hard = s.config.hard_watermark * s.pool_blocks
    assert s.committed_blocks <= hard - 0.05 * s.pool_blocks
    # No batch work runs, so nothing could be preempted; the critical request still starts.
    crit = s.submit(req("crit", tenant="sys", priority=Priority.CRITICAL, prompt=40, max_new=24))
    assert crit.outcome is Decision.ADMIT
    assert s.committed_blocks <= hard


def test_without_a_reserve_critical_work_queues_behind_interactive_work() -> None:
    s, _ = reserve_scheduler(0.0)
    fill_interactive(s)
    crit = s.submit(req("crit", tenant="sys", priority=Priority.CRITICAL, prompt=40, max_new=24))
    assert crit.outcome is Decision.QUEUE


def test_a_critical_request_too_big_for_the_room_does_not_hold_back_a_small_one() -> None:
    s, clock = reserve_scheduler(0.05)
    fill_interactive(s)
    s.submit(req("i-queued-out", prompt=40, max_new=24))  # more interactive work waiting
    big = s.submit(req("big", tenant="sys", priority=Priority.CRITICAL, prompt=4000, max_new=8))
    assert big.outcome is Decision.QUEUE  # needs more than the reserve; no batch to preempt
    small = s.submit(req("small", tenant="sys", priority=Priority.CRITICAL, prompt=40, max_new=8))
    assert small.outcome is Decision.QUEUE  # queues behind it, as arrival order says
    step(s, clock)
    assert s.state("small") is not SeqState.WAITING
    assert s.state("big") is SeqState.WAITING


def test_the_reserve_must_leave_room_below_the_hard_watermark() -> None:
    with pytest.raises(ValueError, match="critical_reserve"):
        small_config(critical_reserve=0.95)
