"""Scheduling policies as small strategy objects: the seed policy and three baselines
(`naive`, `vllm`, `tgi`) behind one interface, so runs can compare them.

A policy answers five questions for the scheduler: how big the pool is, in what order the
queue is served, whether a queued sequence may start now, whom to preempt, and whether
short prompts are prefilled ahead of long ones of their class.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING

import contract
from contract import Mutant, Priority
from server.scheduler.config import SchedulerConfig
from server.scheduler.sequence import Sequence
from server.scheduler.types import Admission
from server.scheduler.victims import victim_order

if TYPE_CHECKING:
    from server.scheduler.scheduler import Scheduler


class Start(enum.Enum):
    """Verdict on starting the head of the queue."""

    NOW = "now"
    SKIP = "skip"  # this one must wait, but later ones may still start
    BLOCKED = "blocked"  # the pool is full: nothing behind it starts either


class Policy:
    """Base: FCFS, no reservation, no quotas, unbounded queue, no preemption."""

    name = "base"
    reserve_full = False  # commit input + max_new blocks at start
    enforce_quotas = False  # tenant quotas, priority budgets, share cap
    bounded_queue = False  # max_queued and queue deadlines
    short_prefill_first = False  # within a class, prefill the shortest remaining prompt first

    def pool_blocks(self, cfg: SchedulerConfig, device_free_bytes: int | None) -> int:
        return cfg.pool_blocks()

    def rank(self, priority: Priority) -> int:
        """Queue class: lower is served first; equal ranks are served in arrival order."""
        return 0

    def can_start(self, s: Scheduler, seq: Sequence, commit: int) -> Start:
        """`commit` = blocks the sequence adds to pool commitments if it starts now."""
        if s.running_count >= s.config.max_running_seqs:
            return Start.BLOCKED
        fits = s.committed_blocks + commit <= s.pool_blocks
        return Start.NOW if fits else Start.BLOCKED

    def relieve(self, s: Scheduler) -> tuple[list[str], list[tuple[str, Admission]]]:
        """Reclaim under pressure: (ids preempted, queued requests shed with their verdict)."""
        return [], []

    def pause_batch_prefill(self, s: Scheduler) -> bool:
        return False

    def shortage_victim(self, s: Scheduler) -> Sequence | None:
        """Whom to preempt when a running sequence cannot get its next block."""
        return None


class NaivePolicy(Policy):
    """Admit everything; the pool is all device memory left after weights; never preempt.
    Under long-context load it overruns real memory (activations, fragmentation and
    estimation error are not in its pool), which is the point of the baseline."""

    name = "naive"

    def pool_blocks(self, cfg: SchedulerConfig, device_free_bytes: int | None) -> int:
        if device_free_bytes is None:
            raise ValueError("policy 'naive' sizes its pool from device_free_bytes; pass it")
        return max(1, device_free_bytes // cfg.block_bytes)

    def can_start(self, s: Scheduler, seq: Sequence, commit: int) -> Start:
        return Start.NOW


class VllmPolicy(Policy):
    """vLLM-like: FCFS, start when the prompt's blocks are free (net of other prefills still
    to run), and when a decode runs out of blocks preempt the newest running sequence (its
    KV is dropped and recomputed)."""

    name = "vllm"

    def shortage_victim(self, s: Scheduler) -> Sequence | None:
        return max(s.running(), key=lambda q: q.arrival, default=None)


class TgiPolicy(Policy):
    """TGI-like: reserve the full max_tokens at start, never preempt, unbounded FCFS queue."""

    name = "tgi"
    reserve_full = True


class SeedPolicy(Policy):
    """The shipped policy. Commitments (blocks in use + reserved headroom) stay at or below
    (hard_watermark - critical_reserve) x pool for non-critical work, so the replica cannot
    OOM while real bytes per token stay within the estimate, and critical work always finds
    the reserve free of other classes. Critical work may start up to the hard watermark, and
    past it by at most what running batch work commits (never past the pool); the same step
    then reclaims the excess by preemption in tier order, before any block is allocated."""

    name = "seed"
    reserve_full = True
    enforce_quotas = True
    bounded_queue = True
    short_prefill_first = True

    def rank(self, priority: Priority) -> int:
        return priority.rank

    def can_start(self, s: Scheduler, seq: Sequence, commit: int) -> Start:
        cfg = s.config
        if s.running_count >= cfg.max_running_seqs:
            return Start.BLOCKED
        if not s.tenant_fits(seq):
            return Start.SKIP
        hard = cfg.hard_watermark * s.pool_blocks
        if seq.priority is Priority.CRITICAL:
            # Past the hard line only as far as batch work (always preemptible) can pay back.
            limit = min(s.pool_blocks, hard + s.ledger.commit_by_priority[Priority.BATCH])
            if s.committed_blocks + commit <= limit:
                return Start.NOW
            # Too big for the room left: it waits, but smaller critical requests behind it
            # (short questions) still start; lower classes stay below the reserve anyway.
            return Start.SKIP
        if seq.priority is Priority.BATCH and s.batch_ignores_pressure:
            # The bug: offline work starts whenever it fits in the pool at all.
            return Start.NOW if s.committed_blocks + commit <= s.pool_blocks else Start.SKIP
        if seq.priority is Priority.BATCH:
            long = seq.prompt_len + seq.max_new >= cfg.long_request_tokens
            if long and s.usage > cfg.admission_watermark:
                return Start.SKIP
            batch_cap = (1.0 - cfg.interactive_reserve) * s.pool_blocks
            if s.ledger.commit_by_priority[Priority.BATCH] + commit > batch_cap:
                return Start.SKIP
        limit = (cfg.hard_watermark - cfg.critical_reserve) * s.pool_blocks
        return Start.NOW if s.committed_blocks + commit <= limit else Start.BLOCKED

    def pause_batch_prefill(self, s: Scheduler) -> bool:
        if s.batch_ignores_pressure:  # the bug: batch prefill never pauses
            return False
        return s.usage > s.config.batch_prefill_pause_watermark

    def relieve(self, s: Scheduler) -> tuple[list[str], list[tuple[str, Admission]]]:
        """Commitments above the hard watermark: tier 1 is implicit (cold prefix blocks are
        free blocks, reclaimed LRU on allocation); tier 2 sheds queued soft-quota overage;
        tiers 3-5 preempt running work in victim order until commitments fit again."""
        limit = s.config.hard_watermark * s.pool_blocks
        if s.committed_blocks <= limit:
            return [], []
        shed = s.shed_soft_overage()
        preempted: list[str] = []
        victims: Iterable[Sequence] = victim_order(
            s.running(),
            s.clock(),
            s.config.bytes_per_token,
            s.config.preempted_protection,
            s.over_soft_quota,
            allow_streamed=s.at_risk,
        )
        if s.mutant is Mutant.PREEMPT_BY_AGE:  # the bug: newest first, whatever it is
            victims = sorted(s.running(), key=lambda q: q.arrival, reverse=True)
        reason = contract.PREEMPT_AT_RISK if s.at_risk else "pressure"
        for victim in victims:
            if s.committed_blocks <= limit:
                break
            s.preempt(victim, reason)
            preempted.append(victim.request_id)
        return preempted, shed


POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (SeedPolicy, NaivePolicy, VllmPolicy, TgiPolicy)
}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown scheduler policy {name!r}; choose one of {', '.join(POLICIES)}"
        ) from None
