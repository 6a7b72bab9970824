"""The scheduler's named bugs (mutants), each a subclass that overrides the one place its bug
lives; the shipped classes carry no trace of them.

`contract.Mutant` names every mutant and `contract.MUTANTS` holds each one's summary and the
gates that must catch it. A mutant is switched on for a whole deployment (`kvgate serve
--mutant NAME`) so `kvgate qualify` can prove each release gate catches the bug it exists
for: the replica builds `scheduler_class(mutant)` instead of `Scheduler`. The mutants of the
replica's step loop, the gateway's relay and the tenant book live in the `mutants` module
beside each of those.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Sequence as Seq
from types import MappingProxyType
from typing import Final

from contract import EventKind, Mutant, Priority
from server.scheduler import step
from server.scheduler.kvmanager import KVCacheManager
from server.scheduler.policies import POLICIES, SeedPolicy, Start
from server.scheduler.scheduler import Scheduler
from server.scheduler.sequence import Sequence
from server.scheduler.types import PrefixSpec
from server.scheduler.view import SchedulerView, SeqView
from server.scheduler.waitqueue import ClassQueue

# How often leak_on_cancel leaks: one cancellation in this many keeps its blocks forever.
LEAK_EVERY = 20


def parse_mutant(name: str | None) -> Mutant | None:
    """The mutant called `name`, or None for the correct server; ValueError names the choices."""
    if not name:
        return None
    try:
        return Mutant(name)
    except ValueError:
        choices = ", ".join(m.value for m in Mutant)
        raise ValueError(f"unknown mutant {name!r}; choose one of {choices}") from None


class LeakOnCancel(Scheduler):
    """One cancellation of a running request in LEAK_EVERY stops it and forgets it, but its
    blocks and reservation are never returned (no 'released' event ever follows): the KV
    manager keeps it as a holder forever."""

    _cancels = 0  # cancellations of running requests so far

    def cancel(self, request_id: str, reason: str = "client_disconnect") -> int:
        seq = self.running_seq(request_id)
        if seq is not None:
            self._cancels += 1
            if self._cancels % LEAK_EVERY == 0:
                self._event(seq, EventKind.CANCELLED, reason)
                self._detach(seq)
                return 0
        return super().cancel(request_id, reason)


class NoTenantCap(Scheduler):
    """The hard cap on one tenant's share of the pool is never checked."""

    def tenant_fits(self, seq: SeqView) -> bool:
        return True


class DropPreempted(Scheduler):
    """A preempted request is aborted instead of resumed later."""

    def preempt(self, seq: Sequence, reason: str) -> None:
        super().preempt(seq, reason)
        dropped = self._dequeue_by_id(seq.request_id)
        self.release(dropped, EventKind.CANCELLED, "preempted_dropped")


class _NewestFirstSeed(SeedPolicy):
    def victims(self, view: SchedulerView) -> Iterable[SeqView]:
        return sorted(view.running(), key=lambda q: q.arrival, reverse=True)


class PreemptByAge(Scheduler):
    """Relief preempts the newest running requests first, whatever their priority or value."""

    policy_types = MappingProxyType({**POLICIES, SeedPolicy.name: _NewestFirstSeed})


class _PressureBlindSeed(SeedPolicy):
    def batch_verdict(self, view: SchedulerView, seq: SeqView, commit: int) -> Start | None:
        # Offline work starts whenever it fits in the pool at all.
        return Start.NOW if view.committed_blocks + commit <= view.num_blocks else Start.SKIP

    def pause_batch_prefill(self, view: SchedulerView) -> bool:
        return False


class BatchIgnoresPeak(Scheduler):
    """Batch work skips the queue's order and the pressure ladder's batch rules: it starts
    on arrival and past a blocked head whenever it fits in the pool, and its prefill never
    pauses."""

    policy_types = MappingProxyType({**POLICIES, SeedPolicy.name: _PressureBlindSeed})

    def may_start_on_arrival(self, seq: Sequence) -> bool:
        return seq.priority is Priority.BATCH or super().may_start_on_arrival(seq)

    def start_past_blocked_head(self, aside: list[Sequence]) -> list[str]:
        started: list[str] = []
        while len(aside) < step.MAX_SKIPS:
            seq = self.take_next()
            if seq is None:
                break
            if seq.priority is Priority.BATCH and step.start_verdict(self, seq) is Start.NOW:
                self.start(seq)
                started.append(seq.request_id)
            else:
                aside.append(seq)
        return started


class _ParkingQueue(ClassQueue):
    """Batch work may always queue, and waits with no deadline."""

    def has_room(self, seq: Sequence) -> bool:
        return seq.priority is Priority.BATCH or super().has_room(seq)

    def deadline(self, seq: Sequence) -> float | None:
        return float("inf") if seq.priority is Priority.BATCH else super().deadline(seq)


class _ParkingSeed(SeedPolicy):
    queue_type = _ParkingQueue


class QueueInsteadOfRefuse(Scheduler):
    """Low-priority work waits in the queue with no deadline or bound, until the client gives
    up, instead of being refused (the gateway's half: server.gateway.mutants)."""

    policy_types = MappingProxyType({**POLICIES, SeedPolicy.name: _ParkingSeed})


class _EstimateOnlyKV(KVCacheManager):
    def need_blocks(self, prompt_len: int, max_new: int) -> int:
        return self.config.blocks_for(prompt_len + 1)  # no room for the output

    @property
    def committed_blocks(self) -> int:
        # Only the estimate is counted: blocks grown past it are not committed anywhere.
        over = sum(max(0, len(q.blocks) - q.need_blocks) for q in self.holders())
        return super().committed_blocks - over


class UnderestimateKv(Scheduler):
    """A request's KV estimate leaves out max_tokens and commitments count only the estimate:
    the pool overflows and the replica dies out of memory (PoolExhausted)."""

    kv_manager_type = _EstimateOnlyKV


class _OwnerlessPrefixKV(KVCacheManager):
    def prefix_keys(self, tenant: str, spec: PrefixSpec, prompt: Seq[int]) -> list[bytes]:
        return super().prefix_keys("", spec, prompt)  # forgets whose prefix it is


class SharedPrivatePrefix(Scheduler):
    """Private prefixes are cached without the tenant in their key: identical private
    prompts of two tenants map to the same blocks."""

    kv_manager_type = _OwnerlessPrefixKV


SCHEDULERS: Final[Mapping[Mutant, type[Scheduler]]] = MappingProxyType(
    {
        Mutant.LEAK_ON_CANCEL: LeakOnCancel,
        Mutant.NO_TENANT_CAP: NoTenantCap,
        Mutant.DROP_PREEMPTED: DropPreempted,
        Mutant.PREEMPT_BY_AGE: PreemptByAge,
        Mutant.BATCH_IGNORES_PEAK: BatchIgnoresPeak,
        Mutant.QUEUE_INSTEAD_OF_REFUSE: QueueInsteadOfRefuse,
        Mutant.UNDERESTIMATE_KV: UnderestimateKv,
        Mutant.SHARED_PRIVATE_PREFIX: SharedPrivatePrefix,
    }
)


def scheduler_class(mutant: Mutant | None) -> type[Scheduler]:
    """The scheduler to build for a deployment carrying `mutant` (the shipped one for None
    and for a mutant that lives outside the scheduler)."""
    return Scheduler if mutant is None else SCHEDULERS.get(mutant, Scheduler)
