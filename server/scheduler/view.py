"""What a scheduling policy may read: a read-only view of the scheduler and its KV manager.

A policy decides (may this start, whom to preempt, pause batch prefill?) and the scheduler
acts on the decision; the view exposes no method that changes anything, and the sequences
it hands out are typed as `SeqView`, so mypy refuses a policy that writes one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from contract import Priority
from server.scheduler.config import SchedulerConfig

if TYPE_CHECKING:
    from server.scheduler.kvmanager import KVCacheManager
    from server.scheduler.scheduler import Scheduler


class SeqView(Protocol):
    """One sequence as a policy sees it (server.scheduler.sequence.Sequence is one)."""

    @property
    def request_id(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def priority(self) -> Priority: ...
    @property
    def arrival(self) -> int: ...
    @property
    def replayable(self) -> bool: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def max_new(self) -> int: ...
    @property
    def need_blocks(self) -> int: ...
    @property
    def generated(self) -> int: ...
    @property
    def held_tokens(self) -> int: ...
    @property
    def preemptions(self) -> int: ...
    def decode_age(self, now: float) -> float: ...


@dataclass(frozen=True, slots=True)
class SchedulerView:
    """The pool's figures through the KV manager, per-class commitments from the ledger, the
    running set and the tenant rules, read live (nothing is copied per step)."""

    _scheduler: Scheduler
    _kv: KVCacheManager

    @property
    def config(self) -> SchedulerConfig:
        return self._scheduler.config

    @property
    def num_blocks(self) -> int:
        return self._kv.num_blocks

    @property
    def usage(self) -> float:
        """Blocks in use / pool."""
        return self._kv.usage

    @property
    def committed_blocks(self) -> int:
        """Blocks in use plus reserved headroom (>= blocks in use)."""
        return self._kv.committed_blocks

    @property
    def at_risk(self) -> bool:
        """Usage itself is above the hard watermark: the process could run out of memory."""
        return self._scheduler.at_risk

    def committed_by_priority(self, priority: Priority) -> int:
        return self._kv.ledger.commit_by_priority[priority]

    @property
    def running_count(self) -> int:
        return self._scheduler.running_count

    def running(self) -> Iterator[SeqView]:
        """Sequences holding blocks and still running, in the order they started."""
        return self._scheduler.running()

    def tenant_fits(self, seq: SeqView) -> bool:
        """Starting `seq` keeps its tenant within its share of the pool."""
        return self._scheduler.tenant_fits(seq)

    def over_soft_quota(self, tenant: str) -> bool:
        return self._scheduler.over_soft_quota(tenant)

    def now(self) -> float:
        return self._scheduler.clock()
