"""Admission screening: the checks a request must pass before it may start or queue, each
failure turned into a rejection a person can act on."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from contract import RejectCode
from server.scheduler.sequence import Sequence
from server.scheduler.types import Admission, Decision

if TYPE_CHECKING:
    from server.scheduler.scheduler import Scheduler


def reject(
    reason: RejectCode, message: str, max_new: int, retry_after_s: float | None = None
) -> Admission:
    """A rejection; Retry-After is whole seconds (at least 1) where waiting can help."""
    retry = float(max(1, math.ceil(retry_after_s or 1.0))) if reason.retryable else None
    return Admission(Decision.REJECT, reason, reason.http_status, retry, message, None, max_new, 0)


def screen(s: Scheduler, seq: Sequence) -> Admission | None:
    """The first rule `seq` breaks, as a rejection; None when it may start or queue."""
    total = seq.prompt_len + seq.max_new
    model = s.config.profile
    if total > model.max_context:
        return reject(
            RejectCode.TOO_LONG,
            f"input plus max_tokens ({seq.prompt_len} + {seq.max_new} = {total} tokens) exceeds "
            f"the {model.max_context}-token context of {model.name}; shorten the input or "
            f"lower max_tokens",
            seq.max_new,
        )
    if s.policy.enforce_quotas:
        verdict = _screen_identity(s, seq)
        if verdict is not None:
            return verdict
    limit = s.start_ceiling(seq)
    if seq.need_blocks > limit:
        return reject(
            RejectCode.TOO_LONG,
            f"input plus max_tokens ({total} tokens) needs {seq.need_blocks} KV blocks, more "
            f"than this replica can ever hold for one {seq.priority.value} request ({limit} "
            f"blocks); shorten the input or lower max_tokens",
            seq.max_new,
        )
    if s.policy.enforce_quotas:
        return _screen_tenant(s, seq)
    return None


def _screen_identity(s: Scheduler, seq: Sequence) -> Admission | None:
    """May this tenant send this class at all, and this long a request?"""
    quota = s.tenants.get(seq.tenant)
    prio = seq.priority.value
    if quota is None or quota.budget(seq.priority) <= 0:
        who = "unknown tenant" if quota is None else "your tenant"
        return reject(
            RejectCode.PRIORITY_NOT_ALLOWED,
            f"{who} {seq.tenant!r} may not send {prio} traffic to this replica; use an API key "
            f"that allows the {prio} class",
            seq.max_new,
        )
    if seq.prompt_len + seq.max_new > quota.max_context_tokens:
        return reject(
            RejectCode.TOO_LONG,
            f"input plus max_tokens exceeds your tenant's {quota.max_context_tokens}-token "
            f"context limit; shorten the input or lower max_tokens",
            seq.max_new,
        )
    return None


def _screen_tenant(s: Scheduler, seq: Sequence) -> Admission | None:
    quota = s.tenants[seq.tenant]
    prio = seq.priority.value
    total = seq.prompt_len + seq.max_new
    cap = s.share_cap_blocks
    if seq.need_blocks > cap:
        return reject(
            RejectCode.TOO_LONG,
            f"input plus max_tokens ({total} tokens, {seq.need_blocks} KV blocks) is larger than "
            f"your tenant's {s.config.tenant_max_share:.0%} share of the pool ({cap} blocks); "
            f"shorten the input or lower max_tokens",
            seq.max_new,
        )
    acct = s.kv.ledger.account(seq.tenant)
    wait = s.estimated_wait(seq.priority)
    held = acct.reserved_tokens + acct.queued_tokens
    if held + total > quota.hard_reserved_tokens:
        return _quota(
            seq,
            wait,
            f"your tenant holds {held} reserved tokens and this request adds {total}, above "
            f"its hard quota of {quota.hard_reserved_tokens}; retry after requests finish or "
            f"lower max_tokens",
        )
    budget = quota.budget(seq.priority)
    used = acct.reserved_by_priority[seq.priority]
    if used + total > budget:
        return _quota(
            seq,
            wait,
            f"your tenant's {prio} budget is {budget} reserved tokens, {used} are in use and "
            f"this request needs {total}; retry later or lower max_tokens",
        )
    seqs = acct.active_seqs + acct.queued_seqs
    if seqs >= quota.max_active_seqs:
        return _quota(
            seq,
            wait,
            f"your tenant already has {seqs} active or queued requests, its limit is "
            f"{quota.max_active_seqs}; retry when one finishes",
        )
    gpu = s.kv.ledger.gpu_seconds(seq.tenant)
    if gpu >= quota.max_gpu_seconds:
        return _quota(
            seq,
            60.0,
            f"your tenant has used {gpu:.1f} GPU seconds of its "
            f"{quota.max_gpu_seconds:g}; ask for a larger quota",
        )
    blocks = acct.commit_blocks  # queued demand is not committed; it waits for the tenant
    # Only when the share cap binds before the pool does; otherwise it is a capacity matter.
    if cap < s.start_ceiling(seq) and not s.tenant_fits(seq):
        return _quota(
            seq,
            wait,
            f"your tenant holds {blocks} KV blocks and this request needs {seq.need_blocks}, "
            f"above the {s.config.tenant_max_share:.0%} per-tenant share of the pool ({cap} "
            f"blocks); retry after your requests finish",
        )
    return None


def _quota(seq: Sequence, wait: float, message: str) -> Admission:
    return reject(RejectCode.TENANT_QUOTA, message, seq.max_new, wait)


def deadline_rejection(s: Scheduler, seq: Sequence) -> Admission:
    waited = s.clock() - seq.t_submit
    return reject(
        RejectCode.DEADLINE_EXPIRED,
        f"the request waited {waited:.1f} s in the queue without capacity freeing (deadline "
        f"{seq.deadline - seq.t_submit:.1f} s); retry later or send it as batch work",
        seq.max_new,
        s.estimated_wait(seq.priority),
    )


def soft_overage_rejection(s: Scheduler, seq: Sequence) -> Admission:
    soft = s.tenants[seq.tenant].soft_reserved_tokens
    return reject(
        RejectCode.TENANT_QUOTA,
        f"the replica is under memory pressure and your tenant is over its soft quota ({soft} "
        f"reserved tokens); retry when your running requests finish",
        seq.max_new,
        s.estimated_wait(seq.priority),
    )
