"""The step: chunked prefill, the pressure ladder, commitments, release and the event log."""

from __future__ import annotations

import pytest

from server.scheduler import Decision, Priority, Scheduler, SeqState
from server.scheduler.sequence import Sequence
from server.scheduler.waitqueue import ClassQueue
from tests.server.scheduler.helpers import (
    FakeClock,
    check_invariants,
    req,
    run_until_idle,
    small_config,
    step,
    tenants,
)


def make(**cfg: object) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    return Scheduler(small_config(**cfg), tenants("a", "b", "c"), clock=clock), clock


def big() -> tuple[Scheduler, FakeClock]:
    """1773 blocks: watermarks at 1453.9 (admission), 1560.2 (pause), 1631.2 (hard)."""
    return make(kv_pool_gib=4.0, step_token_budget=1024)


def prefill_all(s: Scheduler, clock: FakeClock, limit: int = 200) -> None:
    for _ in range(limit):
        if not any(s.prefilling.values()):
            return
        step(s, clock)
    raise AssertionError("prefill did not finish")


def test_chunked_prefill_in_budget_sized_chunks_then_decode() -> None:
    s, clock = make()  # step_token_budget 64
    s.submit(req("r", prompt=150, max_new=3))
    chunks = [step(s, clock).prefill for _ in range(3)]
    assert [(c[0].start, c[0].tokens) for c in chunks] == [(0, 64), (64, 64), (128, 22)]
    assert s.generated_tokens("r") == 1  # the completing chunk produced the first token
    assert step(s, clock).decode == ("r",)
    plan = step(s, clock)
    assert plan.decode == ("r",) and s.state("r") is SeqState.FINISHED


def test_critical_prefill_goes_first_and_decodes_take_budget_first() -> None:
    s, clock = make()
    s.submit(req("batch", "a", Priority.BATCH, prompt=100, max_new=50))
    s.submit(req("inter", "b", Priority.INTERACTIVE, prompt=20, max_new=50))
    s.submit(req("crit", "c", Priority.CRITICAL, prompt=30, max_new=50))
    plan = step(s, clock)
    assert [(c.request_id, c.tokens) for c in plan.prefill] == [
        ("crit", 30),
        ("inter", 20),
        ("batch", 14),
    ]
    plan = step(s, clock)
    assert set(plan.decode) == {"crit", "inter"}
    assert [(c.request_id, c.start, c.tokens) for c in plan.prefill] == [("batch", 14, 62)]
    assert plan.batched_tokens == 64


def test_admission_watermark_holds_back_long_batch_only() -> None:
    s, clock = big()
    for i in range(4):  # 4 x 365 blocks in use = 1460 > 1453.9
        s.submit(req(f"i{i}", "a", prompt=5840, max_new=100))
    prefill_all(s, clock)
    assert s.usage > s.config.admission_watermark
    long_batch = s.submit(req("long", "b", Priority.BATCH, prompt=1000, max_new=100))
    short_batch = s.submit(req("short", "b", Priority.BATCH, prompt=100, max_new=8))
    long_inter = s.submit(req("li", "c", Priority.INTERACTIVE, prompt=1000, max_new=100))
    assert (long_batch.outcome, short_batch.outcome, long_inter.outcome) == (
        Decision.QUEUE,
        Decision.QUEUE,  # FCFS within batch: it waits behind the long one at the head...
        Decision.ADMIT,
    )
    plan = step(s, clock)
    assert plan.admitted == ("short",)  # ...until the step skips the held-back long request
    assert s.state("long") is SeqState.WAITING
    for i in range(4):
        s.cancel(f"i{i}")
    assert step(s, clock).admitted == ("long",)


def test_batch_prefill_pauses_above_pause_watermark() -> None:
    s, clock = big()
    for i in range(2):  # 2 x 785 = 1570 blocks in use > 1560.2; 2 x 788 committed
        s.submit(req(f"i{i}", "a", prompt=12560, max_new=40))
    prefill_all(s, clock)
    assert s.usage > s.config.batch_prefill_pause_watermark
    # 54 more committed blocks: 1630 <= 1631.2, and 850 tokens is not "long": it starts.
    assert s.submit(req("b", "b", Priority.BATCH, prompt=800, max_new=50)).outcome is (
        Decision.ADMIT
    )
    for _ in range(3):
        plan = step(s, clock)
        assert plan.prefill == () and len(plan.decode) == 2
    s.cancel("i0")
    assert s.usage < s.config.batch_prefill_pause_watermark
    assert [c.request_id for c in step(s, clock).prefill] == ["b"]


def test_cancel_releases_blocks_in_the_same_call_and_logs_it() -> None:
    s, clock = make()
    s.submit(req("r", prompt=100, max_new=50))
    step(s, clock)
    step(s, clock)
    s.drain_events()
    held = s.kv.pool.used
    assert held > 0
    assert s.cancel("r") == held
    assert s.kv.pool.used == 0 and s.committed_blocks == 0
    events = s.drain_events()
    assert [(e.event, e.blocks, e.reason) for e in events] == [
        ("cancelled", held, "client_disconnect"),  # what it held when cancelled
        ("released", held, "client_disconnect"),
    ]
    assert events[-1].pool_used_blocks == 0 and events[-1].t == clock.t
    assert s.cancel("r") == 0 and s.cancel("never-seen") == 0
    check_invariants(s)


def test_cancel_during_an_inflight_step_is_safe() -> None:
    s, clock = make()
    s.submit(req("r", prompt=10, max_new=50))
    step(s, clock)
    plan = s.schedule()
    assert plan.decode == ("r",)
    s.cancel("r")
    s.commit(plan)
    assert s.state("r") is SeqState.FINISHED and s.kv.pool.used == 0
    check_invariants(s)


def test_cancel_a_queued_request() -> None:
    s, _ = make()
    for i in range(4):
        s.submit(req(f"f{i}", "b", prompt=1000, max_new=600))
    assert s.submit(req("q", prompt=1000, max_new=600)).outcome is Decision.QUEUE
    s.drain_events()
    assert s.cancel("q") == 0
    assert [e.event for e in s.drain_events()] == ["cancelled", "released"]
    assert len(s.queue) == 0 and s.kv.ledger.accounts["a"].queued_seqs == 0


def test_finished_release_in_commit_and_reservation_shrinks() -> None:
    s, clock = make()
    s.submit(req("r", prompt=16, max_new=64))  # 80 tokens reserved = 5 blocks
    step(s, clock)  # prefill 16 + first token: 2 blocks (room for the next token)
    headrooms = []
    for _ in range(20):
        headrooms.append(s.kv.ledger.headroom_blocks)
        step(s, clock)
    assert headrooms[0] == 3 and headrooms[-1] < headrooms[0]
    assert s.committed_blocks == 5  # used + headroom: the commitment itself is constant
    assert s.kv.ledger.accounts["a"].reserved_tokens == 80
    plan = s.schedule()
    clock.advance(0.01)
    s.commit(plan, finished=["r"])  # EOS: everything back at once
    assert s.kv.pool.used == 0 and s.committed_blocks == 0
    assert s.kv.ledger.accounts["a"].reserved_tokens == 0
    assert [e.event for e in s.drain_events()][-2:] == ["finished", "released"]


def test_request_finishes_at_its_max_tokens() -> None:
    s, clock = make()
    s.submit(req("r", prompt=8, max_new=5))
    steps = 0
    while s.state("r") is not SeqState.FINISHED:
        step(s, clock)
        steps += 1
    assert s.generated_tokens("r") == 5 and steps == 5


def test_every_transition_records_an_event() -> None:
    s, clock = make()
    s.submit(req("r", prompt=8, max_new=2))
    step(s, clock)
    step(s, clock)
    events = s.drain_events()
    assert [e.event for e in events] == ["admitted", "finished", "released"]
    assert events[0].reserved_tokens == 10 and events[0].pool_total_blocks == s.pool_blocks
    assert events[-1].blocks == 1 and events[-1].pool_used_blocks == 0
    assert events[1].used_tokens == 10


def test_preempted_request_requeues_at_its_arrival_position() -> None:
    q = ClassQueue(small_config())
    seqs = [Sequence(req(f"r{i}"), i, 8, 3, [], True, 0.0, 10.0) for i in range(1, 4)]
    q.push(seqs[0])
    q.push(seqs[2])
    seqs[1].state = SeqState.PREEMPTED
    q.push(seqs[1])
    order = [q.pop_next() for _ in range(3)]
    assert [x.request_id if x else None for x in order] == ["r1", "r2", "r3"]
    assert q.pop_next() is None


def test_schedule_twice_without_commit_is_refused() -> None:
    s, _ = make()
    s.schedule()
    try:
        s.schedule()
    except RuntimeError as err:
        assert "commit()" in str(err)
    else:
        raise AssertionError("second schedule() should raise")


def test_gpu_time_is_charged_to_what_ran() -> None:
    s, clock = make()
    s.submit(req("x", "a", prompt=10, max_new=50))
    s.submit(req("y", "b", prompt=10, max_new=50))
    step(s, clock, dt=0.2)  # both prefill: 20 prompt tokens share 0.2 s
    assert s.gpu_seconds("x") == pytest.approx(0.1) and s.gpu_seconds("y") == pytest.approx(0.1)
    plan = s.schedule(token_budget=1)  # only one decoder fits this step
    clock.advance(1.0)
    s.commit(plan)
    ran, idle = ("x", "y") if plan.decode == ("x",) else ("y", "x")
    assert (s.generated_tokens(ran), s.generated_tokens(idle)) == (2, 1)  # idle did not advance
    assert s.gpu_seconds(ran) == pytest.approx(1.1) and s.gpu_seconds(idle) == pytest.approx(0.1)
    assert s.stats().tenant_gpu_seconds == pytest.approx(
        {"a": s.gpu_seconds("x"), "b": s.gpu_seconds("y")}
    )
    s.cancel(ran)
    assert s.gpu_seconds(ran) == pytest.approx(1.1)  # kept after the request ended
    check_invariants(s)


def test_a_finished_request_is_remembered_without_its_prompt() -> None:
    """The scheduler remembers 4096 finished requests for their counters. With their prompts
    (a 32K-token prompt is a tuple of 32K ints) a replica grew 16 MB a minute under a steady
    soak, until the memory was full: hundreds of MB, up to gigabytes of long contexts."""
    s, clock = make()
    s.submit(req("r", prompt=150, max_new=3))
    run_until_idle(s, clock)
    assert s.state("r") is SeqState.FINISHED and s.generated_tokens("r") == 3
    remembered = s._finished["r"]
    assert remembered.req.prompt_tokens == () and remembered.prefix_keys == []
    assert remembered.prompt_len == 150  # what the counters need stays
