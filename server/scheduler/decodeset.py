"""The decode set: sequences past prefill, advanced one token per step without touching them.

Each member's `generated` and `kv_tokens` are its settled values plus (steps - its mark), so
a decode step is O(1) plus the few members that need attention this step: those that reach
max_new_tokens or fill their last block. Those are found through wake-up buckets keyed by
the step at which it happens.
"""

from __future__ import annotations

from collections.abc import Iterator

from server.scheduler.ledger import TenantLedger
from server.scheduler.sequence import Sequence


class DecodeSet:
    """Members in the order they joined; `steps` counts committed decode steps.

    Invariants: a member has dset = self and dmark <= steps; `mark_sum` is the sum of the
    members' marks, so the unsettled KV growth of all members is len * steps - mark_sum; a
    member has a live wake-up (bucket entry carrying its current mark) at the step its output
    reaches max_new or its KV reaches its block capacity, whichever comes first. The snapshot
    handed to a step is cached until membership changes and never mutated.
    """

    def __init__(self, ledger: TenantLedger) -> None:
        self._ledger = ledger
        self._seqs: dict[str, Sequence] = {}
        self._snap: tuple[tuple[str, ...], list[Sequence]] | None = None
        self._wakes: dict[int, list[tuple[Sequence, int]]] = {}
        self.steps = 0
        self.mark_sum = 0
        self.settled_kv = 0  # KV growth moved from lazy to settled by members leaving

    def __len__(self) -> int:
        return len(self._seqs)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._seqs.values())

    @property
    def pending_kv(self) -> int:
        """KV tokens members gained since their marks (not yet settled into their fields)."""
        return len(self._seqs) * self.steps - self.mark_sum

    def add(self, seq: Sequence) -> None:
        assert seq.dset is None and seq.gen_settled < seq.max_new
        assert seq.kv_settled < seq.capacity, "a decoder needs a free slot for its next token"
        seq.dset = self
        seq.dmark = self.steps
        self.mark_sum += self.steps
        self._seqs[seq.request_id] = seq
        self._ledger.decode_enter(seq)
        self._snap = None
        self._wake(seq)

    def discard(self, request_id: str) -> None:
        """Remove a member, settling its counters into its fields."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        grown = self.steps - seq.dmark
        seq.gen_settled += grown
        seq.kv_settled += grown
        self.settled_kv += grown
        self.mark_sum -= seq.dmark
        seq.dset = None
        self._ledger.decode_leave(seq)
        self._snap = None

    def snapshot(self, budget: int) -> tuple[tuple[str, ...], list[Sequence], list[Sequence]]:
        """(ids, members) of the first `budget` members, and the members left out."""
        if self._snap is None:
            seqs = list(self._seqs.values())
            self._snap = (tuple([q.request_id for q in seqs]), seqs)
        ids, seqs = self._snap
        if len(seqs) > budget:
            return ids[:budget], seqs[:budget], seqs[budget:]
        return ids, seqs, []

    def advance(self, held_back: list[Sequence], seconds: float) -> list[Sequence]:
        """Count one decode step. Members in `held_back` were left out of it (token budget):
        they neither advance nor accrue its `seconds` of GPU time. Returns the members that
        need attention now (reached max_new or filled their last block)."""
        self.steps += 1
        for seq in held_back:
            if seq.dset is self:
                seq.dmark += 1
                self.mark_sum += 1
                self._ledger.decode_skip(seq, seconds)
                self._wake(seq)
        due = self._wakes.pop(self.steps, [])
        return [seq for seq, mark in due if seq.dset is self and seq.dmark == mark]

    def rewake(self, seq: Sequence) -> None:
        """Schedule the next wake-up after the member's capacity or cap changed."""
        if seq.dset is self:
            self._wake(seq)

    def _wake(self, seq: Sequence) -> None:
        # In settled terms (no lazy properties): the step at which output reaches max_new or
        # KV reaches capacity; both are at least one step away for a member.
        mark = seq.dmark
        at = mark + min(seq.max_new - seq.gen_settled, seq.capacity - seq.kv_settled)
        bucket = self._wakes.get(at)
        if bucket is None:
            self._wakes[at] = [(seq, mark)]
        else:
            bucket.append((seq, mark))

    def check(self) -> None:
        """Assert the invariants above (tests; O(members))."""
        assert self.mark_sum == sum(q.dmark for q in self._seqs.values())
        for seq in self._seqs.values():
            assert seq.dset is self and seq.dmark <= self.steps
            left = min(seq.max_new - seq.gen_settled, seq.capacity - seq.kv_settled)
            assert left >= 1, f"{seq.request_id} should have been handled already"
            assert (seq, seq.dmark) in self._wakes.get(seq.dmark + left, []), "lost wake-up"
