"""SchedulerStats from the scheduler's incremental counters (what /metrics exports)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from contract import Priority
from server.scheduler.types import SchedulerStats

if TYPE_CHECKING:
    from server.scheduler.scheduler import Scheduler


def collect_stats(s: Scheduler) -> SchedulerStats:
    """O(tenants + priorities): every figure is a counter kept up to date by the transitions.
    Fragmentation is the unused share of allocated block slots (internal fragmentation)."""
    pool, ledger = s.kv.pool, s.kv.ledger
    total = pool.num_blocks
    used_slots = pool.used * s.config.block_tokens
    frag = 0.0 if not used_slots else max(0.0, 1.0 - s.kv_tokens_total / used_slots)
    accts = ledger.accounts
    return SchedulerStats(
        pool_total_blocks=total,
        pool_used_blocks=pool.used,
        pool_reserved_blocks=s.committed_blocks,
        cached_free_blocks=pool.cold,
        fragmentation=frag,
        waiting_by_priority={p: s.queue.by_priority[p] for p in Priority},
        running_by_priority={p: ledger.running_by_priority[p] for p in Priority},
        estimated_wait_s_by_priority={p: s.estimated_wait(p) for p in Priority},
        tenant_reserved_tokens={t: a.reserved_tokens for t, a in accts.items()},
        tenant_pool_share={t: a.commit_blocks / total for t, a in accts.items()},
        tenant_active_seqs={t: a.active_seqs for t, a in accts.items()},
        rejected_requests=dict(s.rejected),
        rejected_tokens=dict(s.rejected_tokens),
        evictions={**s.evictions, "cold_prefix": pool.cold_evictions},
        preemptions={p: s.preemptions[p] for p in Priority},
        recomputes=s.recomputes,
        prefix_queries=pool.queries,
        prefix_hits=pool.hits,
        tenant_longest_context={t: a.longest_context for t, a in accts.items()},
        tenant_gpu_seconds={t: ledger.gpu_seconds(t) for t in accts},
    )
