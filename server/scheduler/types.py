"""Plain data that crosses the scheduler's boundary: requests in, admissions, plans and events out.

Everything here is immutable (frozen dataclasses or str enums) so the replica can hand these
objects to other threads, log them or serialise them without copying.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from contract import EventKind, Priority, RejectCode

# The value function's priority term: higher protects more.
PRIORITY_WEIGHT: Final[Mapping[Priority, float]] = MappingProxyType(
    {Priority.CRITICAL: 1.0, Priority.INTERACTIVE: 0.6, Priority.BATCH: 0.2}
)


class PoolExhausted(RuntimeError):
    """A reserving policy found no block for a sequence it had promised room to. Correct
    reservations make this impossible; the engine treats it as running out of GPU memory."""


class SeqState(enum.StrEnum):
    """Lifecycle of one sequence. WAITING -> RUNNING -> FINISHED, with RUNNING -> PREEMPTED ->
    RECOMPUTING -> RUNNING when its KV is taken away and later rebuilt."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    RECOMPUTING = "recomputing"
    FINISHED = "finished"

    @property
    def is_finished(self) -> bool:
        return self is SeqState.FINISHED

    @property
    def holds_blocks(self) -> bool:
        """RUNNING and RECOMPUTING sequences own KV blocks; the others own none."""
        return self in (SeqState.RUNNING, SeqState.RECOMPUTING)

    @property
    def is_queued(self) -> bool:
        """WAITING and PREEMPTED sequences sit in the wait queue."""
        return self in (SeqState.WAITING, SeqState.PREEMPTED)


class Decision(enum.StrEnum):
    """The only three admission decisions: admit now, queue with a deadline, or reject."""

    ADMIT = "admit"
    QUEUE = "queue"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class PrefixSpec:
    """The first `length` prompt tokens are a shareable prefix (a system prompt).

    The cache key covers model, tokenizer, adapter, chat template and the exact tokens; a
    private prefix (public=False) also keys on tenant and permission_version, so it never
    hits across tenants.
    """

    length: int
    public: bool
    model: str
    tokenizer: str
    adapter: str
    chat_template: str
    permission_version: int = 0


@dataclass(frozen=True, slots=True)
class SeqRequest:
    """One request as the replica hands it to the scheduler (prompt already tokenized)."""

    request_id: str
    tenant: str
    priority: Priority
    prompt_tokens: tuple[int, ...]
    max_new_tokens: int | None
    prefix: PrefixSpec | None = None
    replayable: bool = False
    deadline_ms: int | None = None  # None -> config.queue_deadline_ms


@dataclass(frozen=True, slots=True)
class Admission:
    """The decision on one request: admit, queue until `deadline`, or reject with a reason."""

    outcome: Decision
    reason: RejectCode | None
    http_status: int  # 200 admit/queue; 429, 503, 400, 403 reject
    retry_after_s: float | None
    message: str  # a sentence a person can act on
    deadline: float | None  # queue deadline (clock time) when QUEUE
    max_new_tokens: int  # effective (default applied)
    cached_tokens: int  # prefix-cache hit length (0 if none)


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """Prompt positions [start, start + tokens) of one request, computed this step."""

    request_id: str
    start: int
    tokens: int


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What the engine runs in one step."""

    prefill: tuple[PrefillChunk, ...]  # chunked prefill, critical first
    decode: tuple[str, ...]  # request ids that generate one token this step
    preempted: tuple[str, ...]  # preempted this step (their KV is gone; they recompute later)
    expired: tuple[tuple[str, Admission], ...]  # queued requests rejected this step
    admitted: tuple[str, ...]  # requests that left the queue and started this step

    @property
    def batched_tokens(self) -> int:
        return sum(c.tokens for c in self.prefill) + len(self.decode)


@dataclass(frozen=True, slots=True)
class Event:
    """One state transition of one request: a contract.ServerEvent without the `replica` and
    `seq` that the replica adds."""

    t: float
    request_id: str
    tenant: str
    priority: Priority
    event: EventKind  # a request's kind, never a lifecycle one
    blocks: int  # blocks held after the event ("released": blocks freed)
    reserved_tokens: int
    used_tokens: int
    reason: str | None
    pool_used_blocks: int
    pool_total_blocks: int


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """What /metrics exports; cheap to compute (O(tenants + priorities))."""

    pool_total_blocks: int
    pool_used_blocks: int
    pool_reserved_blocks: int
    cached_free_blocks: int
    fragmentation: float
    waiting_by_priority: dict[Priority, int]
    running_by_priority: dict[Priority, int]
    estimated_wait_s_by_priority: dict[Priority, float]
    tenant_reserved_tokens: dict[str, int]
    tenant_pool_share: dict[str, float]
    tenant_active_seqs: dict[str, int]
    rejected_requests: dict[tuple[str, str, str], int]  # (reason, priority, tenant) -> count
    rejected_tokens: dict[str, int]
    evictions: dict[str, int]
    preemptions: dict[Priority, int]
    recomputes: int
    prefix_queries: int
    prefix_hits: int
    tenant_longest_context: dict[str, int] = field(default_factory=dict)  # live input+max_new
    tenant_gpu_seconds: dict[str, float] = field(default_factory=dict)
