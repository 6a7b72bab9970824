"""How late the load generator's own event loop ran while the load went on.

Every request's timing passes through one gevent loop per load-generator process: a request
goes out when its greenlet runs, a cancellation closes its stream when the loop gets to the
fourth token, a token is read when the loop reads it. Kernel receive stamps keep the first
token's arrival honest when the loop reads late, but nothing keeps a late send or a late
cancel honest. A loop that waits in the operating system's run queue (a busy neighbour, or
a target the scheduler favours: contract.host.OWN_GROUP) makes every one of those late, and
the run then measures the load generator, not the server.

So each process keeps a greenlet that asks to wake every TICK_S and notes how late it woke,
from the load's start until its users are told to stop (the stop itself is the load
generator's busiest moment and measures nothing of the server). The lateness goes into a
histogram of whole milliseconds, which processes merge by adding counts; meta.json keeps
its p50, p99 and max (`load_generator.loop_lag_ms`) and the `loop_kept_up` evidence check
holds the p99 to the run's bound (gates/evidence/checks_client.py says why that bound).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import gevent

TICK_S = 0.01
# Lateness in whole milliseconds, one bucket each up to this; later wakes keep their own ms
BUCKETS = 1000


class LoopLag:
    """The event loop's lateness in one process. Invariant: `counts[i]` ticks woke between
    i and i+1 ms late; `over` holds the ms of those that woke BUCKETS ms late or more."""

    def __init__(self) -> None:
        self.counts = [0] * BUCKETS
        self.over: list[float] = []
        self._greenlet: gevent.Greenlet[Any, Any] | None = None

    def start(self) -> None:
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None

    def _run(self) -> None:
        clock, sleep, counts, over = time.perf_counter, gevent.sleep, self.counts, self.over
        me = gevent.getcurrent()
        while True:
            asked = clock()
            sleep(TICK_S)
            if self._greenlet is not me:  # stopped while it slept: the kill is on its way
                return
            late_ms = max((clock() - asked - TICK_S) * 1000.0, 0.0)
            if late_ms < BUCKETS:
                counts[int(late_ms)] += 1
            else:
                over.append(round(late_ms, 1))

    def as_message(self) -> dict[str, Any]:
        """What a worker sends its master: sparse counts and the long waits."""
        return {"counts": {str(i): n for i, n in enumerate(self.counts) if n}, "over": self.over}

    def add(self, message: Mapping[str, Any]) -> None:
        """Merges another process's `as_message`."""
        for key, n in dict(message.get("counts") or {}).items():
            self.counts[int(key)] += int(n)
        self.over.extend(float(v) for v in message.get("over") or ())

    def summary(self) -> dict[str, float | int] | None:
        """p50, p99 (upper edges of their buckets) and max in ms, and the ticks counted;
        None when no tick was counted."""
        ticks = sum(self.counts) + len(self.over)
        if ticks == 0:
            return None
        over = sorted(self.over)
        top = max(over) if over else float(max(i for i, n in enumerate(self.counts) if n) + 1)
        return {
            "ticks": ticks,
            "p50": self._quantile(0.50, ticks, over),
            "p99": self._quantile(0.99, ticks, over),
            "max": top,
        }

    def _quantile(self, q: float, ticks: int, over: list[float]) -> float:
        rank = max(int(q * ticks + 0.999999), 1)  # the ceil(q * n)-th smallest tick
        seen = 0
        for i, n in enumerate(self.counts):
            seen += n
            if seen >= rank:
                return float(i + 1)
        return over[rank - seen - 1]
