"""The wait queues: each queue discipline a policy can have is one class (service order,
bound, deadlines), so the scheduler asks its queue instead of asking which policy it runs.

Removal is lazy (heap entries of departed sequences are skipped when they surface), so
submit, cancel and start are O(log n).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator

from contract import Priority
from server.scheduler.config import SchedulerConfig
from server.scheduler.sequence import Sequence
from server.scheduler.types import SeqState


class WaitQueue:
    """Holds WAITING and PREEMPTED sequences in service order: (rank of their class, arrival).
    A preempted sequence re-enters at its original arrival position: ahead of later arrivals,
    never ahead of earlier ones. Only WAITING sequences can expire, at the deadline the
    discipline gives them; a preempted one is recoverable work already accepted and never
    expires (its deadline field is kept unchanged).

    A discipline says three things: `rank` (lower is served first; equal ranks in arrival
    order), `has_room` (may one more request queue) and `deadline` (until when, None: no
    limit). This base class is first come, first served: one rank, no bound, no deadline.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._order: list[tuple[int, int, str]] = []
        self._deadlines: list[tuple[float, int, str]] = []
        self._members: dict[str, Sequence] = {}
        self.by_priority: Counter[Priority] = Counter()

    # ----- the discipline ---------------------------------------------------------------

    def rank(self, priority: Priority) -> int:
        return 0

    def has_room(self, seq: Sequence) -> bool:
        """May `seq` wait here (the caller refuses it otherwise)?"""
        return True

    def deadline(self, seq: Sequence) -> float | None:
        """When `seq`, while WAITING, is taken off the queue and refused (None: never)."""
        return None

    def ahead(self, priority: Priority) -> int:
        """Queued sequences a new arrival of `priority` would be served after."""
        rank = self.rank(priority)
        return sum(n for p, n in self.by_priority.items() if self.rank(p) <= rank)

    # ----- the container ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._members

    def __iter__(self) -> Iterator[Sequence]:
        return iter(list(self._members.values()))

    def get(self, request_id: str) -> Sequence | None:
        return self._members.get(request_id)

    def push(self, seq: Sequence) -> None:
        assert seq.state.is_queued and seq.request_id not in self._members
        self._members[seq.request_id] = seq
        self.by_priority[seq.priority] += 1
        heapq.heappush(self._order, (self.rank(seq.priority), seq.arrival, seq.request_id))
        if seq.state is SeqState.WAITING:
            deadline = self.deadline(seq)
            if deadline is not None:
                heapq.heappush(self._deadlines, (deadline, seq.arrival, seq.request_id))

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


class ClassQueue(WaitQueue):
    """Served by class (critical, then interactive, then batch), in arrival order within a
    class; at most `max_queued` requests wait, each until its queue deadline, and are then
    refused, never left to time out (the seed's rule: never an unbounded queue)."""

    def rank(self, priority: Priority) -> int:
        return priority.rank

    def has_room(self, seq: Sequence) -> bool:
        return len(self) < self.config.max_queued

    def deadline(self, seq: Sequence) -> float | None:
        return seq.deadline
