"""One scheduling step as a short sequence of named phases: expire deadlines, start queued
work, relieve pressure, feed starved decodes, plan chunks; and the commit that follows.

A steady decode batch costs O(1) per step: the decode set hands out a cached snapshot and
advances its members lazily, so commit touches only the sequences due this step (reaching
max_new_tokens or filling their last block, about one in block_tokens per step). Prefill,
admission and preemption cost what they touch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import contract
from contract import EventKind, Priority
from server.scheduler.policies import Start
from server.scheduler.sequence import Sequence
from server.scheduler.types import Admission, PrefillChunk, SeqState, StepPlan

if TYPE_CHECKING:
    from server.scheduler.scheduler import Scheduler

MAX_SKIPS = 64  # queued sequences passed over per step before the start phase gives up
HEAD_SHARE = 4  # short-first prefill: the oldest prefill of a class keeps 1/4 of the budget


def start_verdict(s: Scheduler, seq: Sequence) -> Start:
    """Ask the policy whether `seq` may start now, given what its prefix hits save."""
    return s.policy.can_start(s.view, seq, s.kv.start_commit(seq))


def try_start(s: Scheduler, seq: Sequence) -> bool:
    if start_verdict(s, seq) is not Start.NOW:
        return False
    s.start(seq)
    return True


def schedule(s: Scheduler, budget: int) -> StepPlan:
    """Decide this step. The plan must be passed to commit() before the next schedule()."""
    if s.inflight is not None:
        raise RuntimeError("schedule() called again before commit() of the previous plan")
    if budget < 1:
        raise ValueError(f"token_budget must be at least 1, got {budget}")
    expired = _expire(s)
    admitted = _start_queued(s)
    preempted, shed = _relieve(s)
    preempted += _feed_starved(s)
    decode, _, held_back = s.decoding.snapshot(budget)
    prefill = _plan_prefill(s, budget - len(decode))
    plan = StepPlan(
        prefill=prefill,
        decode=decode,
        preempted=tuple(preempted),
        expired=tuple(expired + shed),
        admitted=tuple(admitted),
    )
    s.inflight = (plan, s.clock(), held_back)
    s.queue.compact()
    return plan


def _expire(s: Scheduler) -> list[tuple[str, Admission]]:
    return [(seq.request_id, s.expire(seq)) for seq in s.queue.expired(s.clock())]


def _start_queued(s: Scheduler) -> list[str]:
    """Start queued sequences in service order until the pool says BLOCKED."""
    started: list[str] = []
    aside: list[Sequence] = []
    while len(aside) < MAX_SKIPS:
        seq = s.take_next()
        if seq is None:
            break
        verdict = start_verdict(s, seq)
        if verdict is Start.NOW:
            s.start(seq)
            started.append(seq.request_id)
            continue
        aside.append(seq)
        if verdict is Start.BLOCKED:
            started += s.start_past_blocked_head(aside)
            break
    for seq in aside:
        s.requeue(seq)
    return started


def _relieve(s: Scheduler) -> tuple[list[str], list[tuple[str, Admission]]]:
    """Commitments above the policy's relief limit: shed queued soft-quota overage, then
    preempt running work in the policy's victim order until commitments fit again."""
    limit = s.policy.relief_limit(s.view)
    if limit is None or s.committed_blocks <= limit:
        return [], []
    shed = s.shed_soft_overage()
    reason = contract.PREEMPT_AT_RISK if s.at_risk else "pressure"
    preempted: list[str] = []
    for victim in s.policy.victims(s.view):
        if s.committed_blocks <= limit:
            break
        s.preempt(_running(s, victim.request_id), reason)
        preempted.append(victim.request_id)
    return preempted, shed


def _feed_starved(s: Scheduler) -> list[str]:
    """Non-reserving policies: give starved decodes a block, preempting if the policy says so."""
    preempted: list[str] = []
    for seq in list(s.starved.values()):
        while seq.request_id in s.starved:
            if s.kv.grow(seq):
                del s.starved[seq.request_id]
                s.decoding.add(seq)
                continue
            victim = s.policy.shortage_victim(s.view)
            if victim is None:
                return preempted
            s.preempt(_running(s, victim.request_id), "no_free_block")
            preempted.append(victim.request_id)
    return preempted


def _running(s: Scheduler, request_id: str) -> Sequence:
    seq = s.running_seq(request_id)
    assert seq is not None, f"the policy picked {request_id}, which is not running"
    return seq


def _plan_prefill(s: Scheduler, left: int) -> tuple[PrefillChunk, ...]:
    """Chunked prefill within the remaining token budget, critical first; within a class in
    arrival order, or shortest remaining first when the policy asks (see _short_first)."""
    chunks: list[PrefillChunk] = []
    for prio in Priority:
        if prio is Priority.BATCH and s.policy.pause_batch_prefill(s.view):
            continue
        seqs = list(s.prefilling[prio].values())
        if s.policy.short_prefill_first and len(seqs) > 1:
            plan = _short_first(seqs, left)
        else:
            plan = [(seq, seq.target - seq.kv_tokens) for seq in seqs]
        for seq, want in plan:
            if left <= 0:
                return tuple(chunks)
            n = s.kv.allocate_slots(seq, min(want, left))
            if n > 0:
                chunks.append(PrefillChunk(seq.request_id, seq.kv_tokens, n))
                left -= n
    return tuple(chunks)


def _short_first(seqs: list[Sequence], left: int) -> list[tuple[Sequence, int]]:
    """Shares of `left` prefill tokens, shortest remaining prompt first, so a short prompt
    is not queued for seconds behind long ones of its class that started before it (eight
    32K prompts ahead at 2,048 tokens a step is ~25 s of TTFT). The oldest prefill (`seqs`
    is in arrival order) keeps a floor of 1/HEAD_SHARE of the budget: every prefill becomes
    the oldest in time, so a steady flow of short prompts cannot starve a long one."""
    head = seqs[0]
    floor = min(head.target - head.kv_tokens, left // HEAD_SHARE)
    spare = left - floor
    shares = {head.request_id: floor}
    for seq in sorted(seqs, key=lambda q: q.target - q.kv_tokens):
        if spare <= 0:
            break
        n = min(seq.target - seq.kv_tokens - shares.get(seq.request_id, 0), spare)
        shares[seq.request_id] = shares.get(seq.request_id, 0) + n
        spare -= n
    return [(seq, shares[seq.request_id]) for seq in seqs if seq.request_id in shares]


def _grow(s: Scheduler, seq: Sequence) -> bool:
    """One more block for a decoder's next token. A non-reserving policy may find none: the
    sequence then leaves the decode set and waits in `starved` (returns False)."""
    if s.kv.grow(seq):
        return True
    s.decoding.discard(seq.request_id)
    s.starved[seq.request_id] = seq
    return False


def commit(s: Scheduler, plan: StepPlan, finished: Iterable[str]) -> None:
    """The engine ran `plan`. Advance positions, publish prefix blocks, charge GPU time,
    finish (and release, in this call) sequences that hit their cap or are in `finished`.
    Ids cancelled while the plan was in flight, and unknown ids in `finished`, are skipped.
    Decoders advance lazily (DecodeSet); only those due this step are touched."""
    if s.inflight is None or s.inflight[0] is not plan:
        raise RuntimeError("commit() takes the plan the last schedule() returned")
    _, t_plan, held_back = s.inflight
    s.inflight = None
    now = s.clock()
    per_token = max(0.0, now - t_plan) / max(1, plan.batched_tokens)
    s.kv.ledger.meter += per_token  # every decoder accrues one token's share of the step
    due = s.decoding.advance(held_back, per_token)
    done = set(finished)
    for chunk in plan.prefill:
        seq = s.running_seq(chunk.request_id)
        if seq is not None and seq.kv_tokens == chunk.start and seq.prefilling:
            _advance_prefill(s, seq, chunk.tokens, now, per_token, done)
    steps = s.decoding.steps
    for seq in due:  # settled values + lag: the lazy properties, inlined for the hot path
        lag = steps - seq.dmark
        if seq.gen_settled + lag >= seq.max_new:
            done.discard(seq.request_id)
            s.release(seq, EventKind.FINISHED, "length")
        elif seq.kv_settled + lag >= seq.capacity and _grow(s, seq):
            s.decoding.rewake(seq)
    for rid in done:
        seq = s.running_seq(rid)
        if seq is not None:
            s.release(seq, EventKind.FINISHED, "stop")


def _advance_prefill(
    s: Scheduler, seq: Sequence, tokens: int, now: float, per_token: float, done: set[str]
) -> None:
    s.kv.ledger.charge_gpu(seq, per_token * tokens)
    complete = seq.kv_tokens + tokens >= seq.target
    if complete:
        seq.generated += 1  # the completing chunk also produced one output token
        tokens += 1  # and wrote its KV
    s.kv.computed(seq, tokens)
    if not complete:
        return
    seq.state = SeqState.RUNNING
    seq.t_decode_start = now
    del s.prefilling[seq.priority][seq.request_id]
    if seq.generated >= seq.max_new or seq.request_id in done:
        done.discard(seq.request_id)
        s.release(seq, EventKind.FINISHED, "length" if seq.generated >= seq.max_new else "stop")
    elif seq.kv_tokens < seq.capacity or _grow(s, seq):
        s.decoding.add(seq)
