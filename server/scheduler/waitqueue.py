"""The wait queue: ordered by (class rank, arrival), with queue deadlines, bounded by its owner.

Removal is lazy (heap entries of departed sequences are skipped when they surface), so
submit, cancel and start are O(log n).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator

from contract import Priority
from server.scheduler.sequence import Sequence
from server.scheduler.types import SeqState


class WaitQueue:
    """Holds WAITING and PREEMPTED sequences. A preempted sequence re-enters at its original
    arrival position: ahead of later arrivals, never ahead of earlier ones. Only WAITING
    sequences have a live queue deadline; a preempted one is recoverable work already accepted
    and is never expired (its deadline field is kept unchanged)."""

    def __init__(self) -> None:
        self._order: list[tuple[int, int, str]] = []
        self._deadlines: list[tuple[float, int, str]] = []
        self._members: dict[str, Sequence] = {}
        self.by_priority: Counter[Priority] = Counter()

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._members

    def __iter__(self) -> Iterator[Sequence]:
        return iter(list(self._members.values()))

    def get(self, request_id: str) -> Sequence | None:
        return self._members.get(request_id)

    def push(self, seq: Sequence, rank: int) -> None:
        assert seq.state.is_queued and seq.request_id not in self._members
        self._members[seq.request_id] = seq
        self.by_priority[seq.priority] += 1
        heapq.heappush(self._order, (rank, seq.arrival, seq.request_id))
        if seq.state is SeqState.WAITING:
            heapq.heappush(self._deadlines, (seq.deadline, seq.arrival, seq.request_id))

    def remove(self, seq: Sequence) -> None:
        del self._members[seq.request_id]
        self.by_priority[seq.priority] -= 1

    def pop_next(self) -> Sequence | None:
        """Remove and return the first sequence in queue order (None when empty)."""
        while self._order:
            _, _, rid = heapq.heappop(self._order)
            seq = self._members.get(rid)
            if seq is not None:
                self.remove(seq)
                return seq
        return None

    def expired(self, now: float) -> list[Sequence]:
        """Remove and return WAITING sequences whose deadline has passed, earliest first."""
        out = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, rid = heapq.heappop(self._deadlines)
            seq = self._members.get(rid)
            if seq is not None and seq.state is SeqState.WAITING:
                self.remove(seq)
                out.append(seq)
        return out

    def compact(self) -> None:
        """Drop heap entries of departed sequences once they dominate (bounds memory)."""
        if len(self._order) > 2 * len(self._members) + 64:
            self._order = [e for e in self._order if e[2] in self._members]
            heapq.heapify(self._order)
        if len(self._deadlines) > 2 * len(self._members) + 64:
            self._deadlines = [e for e in self._deadlines if e[2] in self._members]
            heapq.heapify(self._deadlines)
