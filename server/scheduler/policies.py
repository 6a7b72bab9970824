"""Scheduling policies as small strategy objects: the seed policy and three baselines
(`naive`, `vllm`, `tgi`) behind one interface, so runs can compare them.

A policy answers, from a read-only SchedulerView, the questions the scheduler asks: how big
the pool is, which wait queue serves it (the queue type carries its service order, bound and
deadlines), whether a queued sequence may start now, how far commitments may rise before
work is preempted and in what order, whom to preempt when a decode finds no block, and
whether batch prefill pauses. The scheduler acts on the answers; a policy changes nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import ClassVar, Final

import contract
from contract import Priority
from server.scheduler.config import SchedulerConfig
from server.scheduler.victims import victim_order
from server.scheduler.view import SchedulerView, SeqView
from server.scheduler.waitqueue import ClassQueue, WaitQueue


class Start(enum.Enum):
    """Verdict on starting the head of the queue."""

    NOW = "now"
    SKIP = "skip"  # this one must wait, but later ones may still start
    BLOCKED = "blocked"  # the pool is full: nothing behind it starts either


class Policy:
    """Base: FCFS, no reservation, no quotas, unbounded queue, no preemption."""

    name: ClassVar[str] = "base"
    queue_type: ClassVar[type[WaitQueue]] = WaitQueue  # first come, first served, unbounded
    reserve_full: ClassVar[bool] = False  # commit input + max_new blocks at start
    enforce_quotas: ClassVar[bool] = False  # tenant quotas, priority budgets, share cap
    short_prefill_first: ClassVar[bool] = False  # within a class, shortest prompt first
    # The pool is the configured kv_pool_gib (False: whatever device memory the weights
    # leave, so no configured size can be too big for the device and none is checked).
    pool_from_config: ClassVar[bool] = True

    def pool_blocks(self, cfg: SchedulerConfig, device_free_bytes: int | None) -> int:
        return cfg.pool_blocks()

    def can_start(self, view: SchedulerView, seq: SeqView, commit: int) -> Start:
        """`commit` = blocks the sequence adds to pool commitments if it starts now."""
        if view.running_count >= view.config.max_running_seqs:
            return Start.BLOCKED
        fits = view.committed_blocks + commit <= view.num_blocks
        return Start.NOW if fits else Start.BLOCKED

    def relief_limit(self, view: SchedulerView) -> float | None:
        """Commitments above this many blocks are relieved this step: queued soft-quota
        overage is shed, then running work preempted in `victims` order until they fit
        (None: never)."""
        return None

    def victims(self, view: SchedulerView) -> Iterable[SeqView]:
        """Running sequences in the order relief preempts them."""
        return ()

    def pause_batch_prefill(self, view: SchedulerView) -> bool:
        return False

    def shortage_victim(self, view: SchedulerView) -> SeqView | None:
        """Whom to preempt when a running sequence cannot get its next block."""
        return None


class NaivePolicy(Policy):
    """Admit everything; the pool is all device memory left after weights; never preempt.
    Under long-context load it overruns real memory (activations, fragmentation and
    estimation error are not in its pool), which is the point of the baseline."""

    name = "naive"
    pool_from_config = False

    def pool_blocks(self, cfg: SchedulerConfig, device_free_bytes: int | None) -> int:
        if device_free_bytes is None:
            raise ValueError("policy 'naive' sizes its pool from device_free_bytes; pass it")
        return max(1, device_free_bytes // cfg.block_bytes)

    def can_start(self, view: SchedulerView, seq: SeqView, commit: int) -> Start:
        return Start.NOW


class VllmPolicy(Policy):
    """vLLM-like: FCFS, start when the prompt's blocks are free (net of other prefills still
    to run), and when a decode runs out of blocks preempt the newest running sequence (its
    KV is dropped and recomputed)."""

    name = "vllm"

    def shortage_victim(self, view: SchedulerView) -> SeqView | None:
        return max(view.running(), key=lambda q: q.arrival, default=None)


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
    queue_type = ClassQueue
    reserve_full = True
    enforce_quotas = True
    short_prefill_first = True

    def can_start(self, view: SchedulerView, seq: SeqView, commit: int) -> Start:
        cfg = view.config
        if view.running_count >= cfg.max_running_seqs:
            return Start.BLOCKED
        if not view.tenant_fits(seq):
            return Start.SKIP
        hard = cfg.hard_watermark * view.num_blocks
        if seq.priority is Priority.CRITICAL:
            # Past the hard line only as far as batch work (always preemptible) can pay back.
            batch = view.committed_by_priority(Priority.BATCH)
            limit = min(view.num_blocks, hard + batch)
            if view.committed_blocks + commit <= limit:
                return Start.NOW
            # Too big for the room left: it waits, but smaller critical requests behind it
            # (short questions) still start; lower classes stay below the reserve anyway.
            return Start.SKIP
        if seq.priority is Priority.BATCH:
            verdict = self.batch_verdict(view, seq, commit)
            if verdict is not None:
                return verdict
        limit = (cfg.hard_watermark - cfg.critical_reserve) * view.num_blocks
        return Start.NOW if view.committed_blocks + commit <= limit else Start.BLOCKED

    def batch_verdict(self, view: SchedulerView, seq: SeqView, commit: int) -> Start | None:
        """The pressure ladder's batch rules: a long batch request waits above the admission
        watermark, and batch never commits the interactive reserve (None: the common limit
        decides)."""
        cfg = view.config
        long = seq.prompt_len + seq.max_new >= cfg.long_request_tokens
        if long and view.usage > cfg.admission_watermark:
            return Start.SKIP
        batch_cap = (1.0 - cfg.interactive_reserve) * view.num_blocks
        if view.committed_by_priority(Priority.BATCH) + commit > batch_cap:
            return Start.SKIP
        return None

    def pause_batch_prefill(self, view: SchedulerView) -> bool:
        return view.usage > view.config.batch_prefill_pause_watermark

    def relief_limit(self, view: SchedulerView) -> float | None:
        """The hard watermark. Tier 1 is implicit (cold prefix blocks are free blocks,
        reclaimed LRU on allocation); tier 2 is the shed soft-quota overage; tiers 3-5 are
        the victim order."""
        return view.config.hard_watermark * view.num_blocks

    def victims(self, view: SchedulerView) -> Iterable[SeqView]:
        cfg = view.config
        return victim_order(
            view.running(),
            view.now(),
            cfg.bytes_per_token,
            cfg.preempted_protection,
            view.over_soft_quota,
            allow_streamed=view.at_risk,
        )


def policy_registry(
    classes: Iterable[type[Policy]], names: tuple[str, ...] = contract.POLICIES
) -> Mapping[str, type[Policy]]:
    """The policy classes by name, in the order of `names`: the contract's list, which a
    plan's `target.policy` and the server's --policy offer. A name without a class, or a
    class the contract does not name, is a TypeError when this module is imported: the
    server never starts offering a policy it cannot run."""
    by_name = {cls.name: cls for cls in classes}
    problems = [f"no policy class is named {name!r}" for name in names if name not in by_name]
    problems += [f"contract.POLICIES does not name {n!r}" for n in sorted(set(by_name) - {*names})]
    if problems:
        raise TypeError(
            f"the scheduler's policies and contract.POLICIES differ: {'; '.join(problems)}; "
            "each policy is a class here whose name contract.PolicyName lists"
        )
    return MappingProxyType({name: by_name[name] for name in names})


# Every policy defined in this module (the direct subclasses of Policy; a mutant's subclass of
# one lives elsewhere and stands in for it by name), by the contract's names.
POLICIES: Final = policy_registry(p for p in Policy.__subclasses__() if p.__module__ == __name__)


def make_policy(name: str, policies: Mapping[str, type[Policy]] = POLICIES) -> Policy:
    try:
        return policies[name]()
    except KeyError:
        raise ValueError(
            f"unknown scheduler policy {name!r}; choose one of {', '.join(policies)}"
        ) from None
