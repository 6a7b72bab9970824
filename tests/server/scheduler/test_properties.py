"""Property tests: random arrivals, cancels and finishes; every invariant checked after every
operation, for the seed policy and the baselines."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contract
from server.scheduler import Decision, PrefixSpec, Priority, Scheduler, SeqRequest, SeqState
from server.scheduler.sequence import Sequence
from server.scheduler.victims import TIER_STREAMED, tier
from server.scheduler.waitqueue import ClassQueue
from tests.server.scheduler.helpers import FakeClock, check_invariants, quota, req, small_config

SYSTEM = tuple(range(9000, 9048))  # 3 blocks of shared system prompt


@dataclass(frozen=True)
class Submit:
    tenant: str
    priority: Priority
    prompt: int
    max_new: int | None
    prefix: str  # "", "private", "public"
    replayable: bool


@dataclass(frozen=True)
class Cancel:
    pick: int


@dataclass(frozen=True)
class Step:
    finish: tuple[int, ...]
    dt: float
    count: int = 1


submits = st.builds(
    Submit,
    tenant=st.sampled_from(["a", "b", "c"]),
    priority=st.sampled_from([Priority.CRITICAL, *Priority]),
    prompt=st.sampled_from([1, 15, 100, 400, 900, 1600]),
    max_new=st.sampled_from([None, 1, 40, 300, 800]),
    prefix=st.sampled_from(["", "private", "public"]),
    replayable=st.booleans(),
)
steps = st.builds(
    Step, st.just(()), st.sampled_from([0.001, 0.05, 0.5, 3.0]), st.sampled_from([1, 5, 30])
)
finishes = st.builds(Step, st.tuples(st.integers(0, 10**6)), st.just(0.01))
cancels = st.builds(Cancel, st.integers(0, 10**6))
ops = st.lists(
    st.one_of(submits, submits, submits, steps, steps, finishes, cancels),
    min_size=10,
    max_size=80,
)


def build(policy: str) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    cfg = small_config(
        kv_pool_gib=0.5, tenant_max_share=0.6, max_new_tokens_default=200, max_queued=6
    )  # 221 blocks
    quotas = {
        "a": quota("a"),
        "b": quota("b", soft_reserved_tokens=300),
        "c": quota("c", budgets={Priority.INTERACTIVE: 3000, Priority.BATCH: 3000}),
    }
    free = None if policy != "naive" else 2 * cfg.kv_pool_gib * (1 << 30)
    sched = Scheduler(
        cfg,
        quotas,
        policy=policy,
        clock=clock,
        device_free_bytes=None if free is None else int(free),
    )
    return sched, clock


def to_request(op: Submit, n: int) -> SeqRequest:
    tokens = tuple(range(n * 1000, n * 1000 + op.prompt))
    spec = None
    if op.prefix:
        tokens = SYSTEM + tokens
        spec = PrefixSpec(len(SYSTEM), op.prefix == "public", "m", "t", "none", "chatml")
    return req(f"r{n}", op.tenant, op.priority, tokens, op.max_new, spec, op.replayable)


class Tracker:
    """Remembers what must survive every transition and checks it after each operation."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s
        self.seen: dict[str, Sequence] = {}
        self.carried: dict[str, tuple[float, float, int, int]] = {}

    def note(self, rid: str) -> None:
        seq = self.s._lookup(rid)
        if seq is not None:
            self.seen[rid] = seq

    def check(self) -> None:
        s = self.s
        check_invariants(s)
        for rid, seq in self.seen.items():
            gpu = s.kv.ledger.seq_gpu_seconds(seq)
            carried = (seq.deadline, gpu, seq.recomputes, seq.preemptions)
            old = self.carried.get(rid)
            if old is not None:
                assert carried[0] == old[0], f"{rid} lost its deadline"
                assert carried[1] >= old[1] and carried[2] >= old[2] and carried[3] >= old[3]
            self.carried[rid] = carried
            if seq.state.is_finished:
                assert not seq.blocks
            assert seq.state.holds_blocks == (s.running_seq(rid) is seq)
        if s.policy.enforce_quotas:
            for acct in s.kv.ledger.accounts.values():
                assert acct.commit_blocks <= s.share_cap_blocks
        # The bound refuses new arrivals; preempted work (already admitted, bounded by the
        # running set) requeues past it rather than being dropped.
        fresh = sum(1 for q in s.queue if q.state is not SeqState.PREEMPTED)
        assert fresh <= s.config.max_queued or not isinstance(s.queue, ClassQueue)


def run_ops(policy: str, program: list[object]) -> None:
    s, clock = build(policy)
    t = Tracker(s)
    live: list[str] = []
    for n, op in enumerate(program):
        if isinstance(op, Submit):
            verdict = s.submit(to_request(op, n))
            t.note(f"r{n}")
            if verdict.outcome is not Decision.REJECT:
                live.append(f"r{n}")
            assert (verdict.reason is None) == (verdict.outcome is not Decision.REJECT)
        elif isinstance(op, Cancel) and live:
            rid = live[op.pick % len(live)]
            s.cancel(rid)
            assert s.state(rid) in (SeqState.FINISHED, None)
            assert s.running_seq(rid) is None and rid not in s.queue  # released now
        elif isinstance(op, Step):
            for _ in range(op.count):
                done = [live[i % len(live)] for i in op.finish] if live else []
                one_step(s, clock, op.dt, done, t)
        live = [rid for rid in live if s.state(rid) not in (SeqState.FINISHED, None)]
        t.check()
    drain(s, clock, t)


def one_step(
    s: Scheduler, clock: FakeClock, dt: float, done: list[str], t: Tracker, full: bool = True
) -> None:
    plan = s.schedule()
    clock.advance(dt)
    s.commit(plan, done)
    for rid in plan.preempted:
        assert s.state(rid) is SeqState.PREEMPTED
    if s.policy.name == "seed":  # critical victims only when the replica itself is at risk
        for e in s.drain_events():
            if e.event == "preempted" and e.priority is Priority.CRITICAL:
                assert e.reason == contract.PREEMPT_AT_RISK
    for rid in done:
        seq = s.running_seq(rid)
        assert seq is None or seq.prefilling, "a finished request must release in commit"
    if s.policy.name == "seed" and s.committed_blocks > s.config.hard_watermark * s.pool_blocks:
        # only work the tiers protect (critical, streamed interactive) may remain
        assert s.at_risk or all(tier(q) == TIER_STREAMED for q in s.running())
    if full:
        t.check()


def drain(s: Scheduler, clock: FakeClock, t: Tracker) -> None:
    """Everything admitted eventually finishes or is refused, and the pool returns to empty."""
    for n in range(20000 if s.policy.name != "naive" else 300):  # naive may stall for good
        if not s.running_count and not len(s.queue):
            break
        one_step(s, clock, 0.01, [], t, full=n % 16 == 0)  # full recounts are O(pool)
    t.check()
    if s.policy.name != "naive":
        assert s.running_count == 0 and len(s.queue) == 0, "work got stuck"
        assert s.kv.pool.used == 0 and s.committed_blocks == 0
        assert all(a.reserved_tokens == 0 for a in s.kv.ledger.accounts.values())


def random_program(seed: int, length: int = 150) -> list[object]:
    """A long, dense program (bursts of arrivals, long runs of steps): drives the pool into
    the pressure ladder far more often than short shrinkable programs do."""
    rng = random.Random(seed)
    program: list[object] = []
    for _ in range(length):
        roll = rng.random()
        if roll < 0.45:
            program.append(
                Submit(
                    rng.choice("abc"),
                    rng.choice([Priority.CRITICAL, *Priority]),
                    rng.choice([1, 15, 100, 400, 900, 1600]),
                    rng.choice([None, 1, 40, 300, 800]),
                    rng.choice(["", "private", "public"]),
                    rng.random() < 0.5,
                )
            )
        elif roll < 0.55:
            program.append(Cancel(rng.randrange(10**6)))
        elif roll < 0.65:
            program.append(Step((rng.randrange(10**6),), 0.01))
        else:
            program.append(Step((), rng.choice([0.001, 0.05, 0.5, 3.0]), rng.choice([1, 5, 30])))
    return program


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(ops)
def test_seed_invariants(program: list[object]) -> None:
    run_ops("seed", program)


@SETTINGS
@given(ops)
def test_vllm_invariants(program: list[object]) -> None:
    run_ops("vllm", program)


@SETTINGS
@given(ops)
def test_tgi_invariants(program: list[object]) -> None:
    run_ops("tgi", program)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_naive_invariants(program: list[object]) -> None:
    run_ops("naive", program)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32))
def test_seed_long_random_programs(seed: int) -> None:
    run_ops("seed", random_program(seed))


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from(["vllm", "tgi", "naive"]))
def test_baseline_long_random_programs(seed: int, policy: str) -> None:
    run_ops(policy, random_program(seed))
