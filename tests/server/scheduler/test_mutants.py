"""The scheduler's mutants: each does exactly its one bug, and the correct scheduler does not.

`kvgate qualify` proves the release gates catch these bugs end to end; these tests pin the
bugs themselves, so a gate that "catches" a mutant is catching the behaviour named here.
"""

from __future__ import annotations

import pytest

from contract import Mutant
from server.scheduler import Decision, PoolExhausted, Priority, Scheduler, SeqState
from server.scheduler.mutants import LEAK_EVERY, parse_mutant, scheduler_class
from tests.server.scheduler.helpers import (
    FakeClock,
    check_invariants,
    req,
    small_config,
    step,
    tenants,
)


def make(mutant: Mutant | None, **cfg: object) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    s = scheduler_class(mutant)(small_config(**cfg), tenants("a", "b", "c"), clock=clock)
    return s, clock


def test_a_mutant_is_parsed_by_its_name() -> None:
    assert parse_mutant(None) is None and parse_mutant("") is None
    assert parse_mutant("slow_release") is Mutant.SLOW_RELEASE
    with pytest.raises(ValueError, match="unknown mutant 'nope'; choose one of slow_release"):
        parse_mutant("nope")


@pytest.mark.parametrize("mutant", [None, Mutant.LEAK_ON_CANCEL])
def test_leak_on_cancel_keeps_one_cancellation_in_twenty(mutant: Mutant | None) -> None:
    s, clock = make(mutant)
    for i in range(LEAK_EVERY):
        s.submit(req(f"r{i}", prompt=16, max_new=64))
    while any(s.prefilling.values()):
        step(s, clock)
    s.drain_events()
    for i in range(LEAK_EVERY):
        s.cancel(f"r{i}")
    released = [e.request_id for e in s.drain_events() if e.event == "released"]
    check_invariants(s)
    if mutant is None:
        assert len(released) == LEAK_EVERY and s.kv.pool.used == 0
        return
    leaked = f"r{LEAK_EVERY - 1}"
    assert leaked not in released and len(released) == LEAK_EVERY - 1
    assert s.kv.pool.used > 0 and s.running_count == 0  # held by nothing that runs, forever
    assert [q.request_id for q in s.kv.holders()] == [leaked]


@pytest.mark.parametrize("mutant", [None, Mutant.NO_TENANT_CAP])
def test_no_tenant_cap_lets_one_tenant_past_its_share(mutant: Mutant | None) -> None:
    s, _ = make(mutant, tenant_max_share=0.5)
    cap = int(0.5 * s.pool_blocks)
    outcomes = [s.submit(req(f"a{i}", prompt=1000, max_new=600)).outcome for i in range(3)]
    assert outcomes[:2] == [Decision.ADMIT, Decision.ADMIT]
    if mutant is None:
        assert outcomes[2] is Decision.REJECT and s.kv.ledger.accounts["a"].commit_blocks <= cap
    else:
        assert outcomes[2] is Decision.ADMIT and s.kv.ledger.accounts["a"].commit_blocks > cap


@pytest.mark.parametrize("mutant", [None, Mutant.DROP_PREEMPTED])
def test_drop_preempted_aborts_instead_of_requeueing(mutant: Mutant | None) -> None:
    s, clock = make(mutant)
    s.submit(req("r", priority=Priority.BATCH, prompt=100, max_new=50))
    step(s, clock)
    seq = s.running_seq("r")
    assert seq is not None
    s.preempt(seq, "pressure")
    check_invariants(s)
    events = [(e.event, e.reason) for e in s.drain_events()][-3:]
    if mutant is None:
        assert s.state("r") is SeqState.PREEMPTED and "r" in s.queue
        step(s, clock)
        assert s.state("r") is SeqState.RECOMPUTING
    else:
        assert s.state("r") is SeqState.FINISHED and "r" not in s.queue
        assert events == [
            ("preempted", "pressure"),
            ("cancelled", "preempted_dropped"),
            ("released", "preempted_dropped"),
        ]


@pytest.mark.parametrize("mutant", [None, Mutant.PREEMPT_BY_AGE])
def test_preempt_by_age_takes_the_newest_even_when_it_is_critical(mutant: Mutant | None) -> None:
    s, clock = make(mutant, interactive_reserve=0.0)
    # Batch work commits the pool up to the hard watermark (4 x 100 of 407 blocks); a
    # critical request then starts past it and the same step must reclaim the excess.
    for i in range(4):
        s.submit(req(f"b{i}", "b", Priority.BATCH, prompt=1000, max_new=600, replayable=True))
    assert s.submit(req("crit", "a", Priority.CRITICAL, prompt=200, max_new=400)).outcome is (
        Decision.ADMIT
    )
    plan = step(s, clock)
    assert plan.preempted and not s.at_risk
    victims = [(e.priority, e.reason) for e in s.drain_events() if e.event == "preempted"]
    # What the victim-order gate reads: a critical victim whose replica was not at risk.
    critical = [r for p, r in victims if p is Priority.CRITICAL]
    assert all(r == "pressure" for _, r in victims)
    if mutant is None:
        assert "crit" not in plan.preempted and s.state("crit") is SeqState.RUNNING
        assert not critical
    else:
        assert plan.preempted[0] == "crit" and s.state("crit") is SeqState.PREEMPTED
        assert critical


@pytest.mark.parametrize("mutant", [None, Mutant.BATCH_IGNORES_PEAK])
def test_batch_ignores_peak_starts_batch_past_the_online_queue(mutant: Mutant | None) -> None:
    s, clock = make(mutant, kv_pool_gib=4.0, step_token_budget=1024)
    for i in range(4):  # online work commits the pool up to the hard watermark
        s.submit(req(f"i{i}", "a", prompt=5800, max_new=600))
    assert s.submit(req("waits", "c", prompt=5800, max_new=600)).outcome is Decision.QUEUE
    batch = s.submit(req("batch", "b", Priority.BATCH, prompt=64, max_new=64))
    step(s, clock)
    if mutant is None:  # it waits behind the online request that has no room
        assert batch.outcome is Decision.QUEUE and s.state("batch") is SeqState.WAITING
    else:
        assert batch.outcome is Decision.ADMIT and s.state("waits") is SeqState.WAITING
    check_invariants(s)


@pytest.mark.parametrize("mutant", [None, Mutant.QUEUE_INSTEAD_OF_REFUSE])
def test_queue_instead_of_refuse_parks_batch_forever(mutant: Mutant | None) -> None:
    s, clock = make(mutant, max_queued=2)
    for i in range(4):
        s.submit(req(f"fill{i}", "a", prompt=1000, max_new=600))
    verdicts = [
        s.submit(req(f"q{i}", "b", Priority.BATCH, prompt=1000, max_new=600)) for i in range(3)
    ]
    clock.advance(60.0)
    plan = step(s, clock)
    if mutant is None:
        assert verdicts[2].outcome is Decision.REJECT and verdicts[2].http_status == 503
        assert {rid for rid, _ in plan.expired} == {"q0", "q1"}
    else:
        assert all(v.outcome is Decision.QUEUE for v in verdicts) and plan.expired == ()
        assert all(s.state(f"q{i}") is SeqState.WAITING for i in range(3))


@pytest.mark.parametrize("mutant", [None, Mutant.UNDERESTIMATE_KV])
def test_underestimate_kv_reserves_no_output_and_runs_out_of_blocks(
    mutant: Mutant | None,
) -> None:
    s, clock = make(mutant)
    verdicts = [s.submit(req(f"r{i}", "a", prompt=1000, max_new=600)) for i in range(8)]
    admitted = sum(v.outcome is Decision.ADMIT for v in verdicts)
    if mutant is None:
        assert admitted == 4  # 100 blocks each, up to the hard watermark
        for _ in range(2000):
            if not s.running_count and not len(s.queue):
                break
            step(s, clock)
        assert s.running_count == 0
        return
    assert admitted == 6  # 63 blocks each: the output allowance is left out
    with pytest.raises(PoolExhausted, match="grew past its reservation of 63 blocks"):
        for _ in range(2000):
            step(s, clock)
