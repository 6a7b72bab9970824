"""Victim selection: the tier order, then the value function V (see `value`) with the two
flaws of its original form fixed (age excludes prefill time; earlier preemptions earn
protection); docs/architecture.md tells why."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from contract import Priority
from server.scheduler.types import PRIORITY_WEIGHT
from server.scheduler.view import SeqView

S = TypeVar("S", bound=SeqView)

MIB = 1 << 20

TIER_REPLAYABLE_BATCH = 3
TIER_VALUE = 4
TIER_STREAMED = 5


def value(
    seq: SeqView, now: float, bytes_per_token: int, protection: float, overage: bool
) -> float:
    """V = 0.3·log1p(age_ms) + 0.25·progress + 0.25·log1p(size_MB) − 0.2·priority_weight,
    plus `protection` per earlier preemption, minus 0.5 when the tenant is over its soft
    quota. Lowest V is preempted first.

    age is decode time only: counting prefill made a 3.5 s prefill look old and protected the
    very request that caused the pressure. progress = generated / (input + generated + 1).
    """
    age_ms = seq.decode_age(now) * 1000.0
    progress = seq.generated / (seq.prompt_len + seq.generated + 1)
    size_mb = seq.held_tokens * bytes_per_token / MIB
    v = (
        0.3 * math.log1p(age_ms)
        + 0.25 * progress
        + 0.25 * math.log1p(size_mb)
        - 0.2 * PRIORITY_WEIGHT[seq.priority]
    )
    return v + protection * seq.preemptions - (0.5 if overage else 0.0)


def tier(seq: SeqView) -> int:
    """3 replayable batch work; 5 an interactive session that already streamed tokens, and
    all critical (system) work, touched only when the process is at risk; 4 the rest."""
    if seq.priority is Priority.BATCH and seq.replayable:
        return TIER_REPLAYABLE_BATCH
    if seq.priority is Priority.CRITICAL:
        return TIER_STREAMED
    if seq.priority is Priority.INTERACTIVE and seq.generated > 0:
        return TIER_STREAMED
    return TIER_VALUE


def victim_order(
    running: Iterable[S],
    now: float,
    bytes_per_token: int,
    protection: float,
    over_soft: Callable[[str], bool],
    allow_streamed: bool,
) -> Iterator[S]:
    """Running sequences in preemption order: by tier, then lowest V. Sequences are bucketed
    by tier in one pass; V is computed only when a tier is reached, and each tier is a heap
    built in O(n), so taking k victims costs O(n + k log n)."""
    tiers: dict[int, list[S]] = {
        TIER_REPLAYABLE_BATCH: [],
        TIER_VALUE: [],
        TIER_STREAMED: [],
    }
    for seq in running:
        tiers[tier(seq)].append(seq)
    if not allow_streamed:
        tiers[TIER_STREAMED] = []
    over: dict[str, bool] = {}  # one quota lookup per tenant, not per sequence
    for t in (TIER_REPLAYABLE_BATCH, TIER_VALUE, TIER_STREAMED):
        heap = []
        for seq in tiers[t]:
            o = over.get(seq.tenant)
            if o is None:
                o = over[seq.tenant] = over_soft(seq.tenant)
            heap.append((value(seq, now, bytes_per_token, protection, o), seq.arrival, seq))
        heapq.heapify(heap)
        while heap:
            yield heapq.heappop(heap)[2]
