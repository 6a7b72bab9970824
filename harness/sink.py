"""Where request records end up: one row per request id, plus the live numbers built from them.

Records arrive from the local Locust users or, batched, from worker processes; either way
they pass through `RecordSink.add`, which writes each request id once (a duplicate is
counted, never written) and keeps a short window of recent endings for the live console
and for the storm detector of `kill_during_storm` faults.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any

from contract import Outcome
from contract.enums import FAILED_OUTCOMES
from gates import schema
from gates.metrics_client import request_failed
from gates.stats import percentile
from harness.rundir import TableWriter

RECENT_WINDOW_S = 60.0


def record_row(record: Any) -> dict[str, Any]:
    """A RequestRecord (or a dict of one) as a plain row of the requests table."""
    if isinstance(record, Mapping):
        return {c: record.get(c) for c in schema.REQUEST_COLUMNS}
    return {c: getattr(record, c, None) for c in schema.REQUEST_COLUMNS}


class RecordSink:
    """Writes records and keeps counters. Invariant: each request_id is written at most once."""

    def __init__(self, writer: TableWriter) -> None:
        self.writer = writer
        self._seen: set[str] = set()
        self.duplicates = 0
        self.with_blocks = 0  # records that carry their prompt's block ids
        self.outcomes: Counter[str] = Counter()
        self.by_worker: Counter[str] = Counter()
        self.by_class: Counter[str] = Counter()
        # (arrival monotonic time, outcome, ttft_s) of recent endings
        self._recent: deque[tuple[float, str, float | None]] = deque()
        # What the availability gate judges (client cancels and probes left out), and how
        # many of those failed: what the early stop of a hopeless run reads.
        self.judged = 0
        self.failed = 0
        # for the live page: recent TTFTs per traffic class, refusals per reason
        self._recent_ttft: dict[str, deque[tuple[float, float]]] = {}
        self.refusals: Counter[str] = Counter()
        # the server's prompt tokens per kvgate prompt token, summed over answered requests
        self._prompt_tokens = [0, 0]  # [server's, kvgate's]

    @property
    def total(self) -> int:
        return len(self._seen)

    def add(self, row: Mapping[str, Any]) -> bool:
        request_id = str(row.get("request_id"))
        if request_id in self._seen:
            self.duplicates += 1
            return False
        self._seen.add(request_id)
        self.writer.write(row)
        outcome = str(row.get("outcome"))
        self.outcomes[outcome] += 1
        if outcome != Outcome.CANCELLED and row.get("probe") is None:
            self.judged += 1
            self.failed += request_failed(
                outcome,
                row.get("http_status"),
                row.get("retry_after_s"),
                row.get("chunks"),
                row.get("max_tokens"),
            )
        self.by_worker[str(row.get("worker"))] += 1
        self.by_class[str(row.get("traffic_class"))] += 1
        self.with_blocks += row.get("prompt_blocks") is not None
        now = time.monotonic()
        ttft = row.get("ttft_s")
        self._recent.append((now, outcome, float(ttft) if ttft is not None else None))
        if ttft is not None:
            klass = str(row.get("traffic_class"))
            self._recent_ttft.setdefault(klass, deque()).append((now, float(ttft)))
        if outcome == Outcome.REJECTED:
            self.refusals[str(row.get("error_code") or row.get("http_status"))] += 1
        server, ours = row.get("prompt_tokens"), row.get("target_prompt_tokens")
        if isinstance(server, int) and isinstance(ours, int) and server > 0 and ours > 0:
            self._prompt_tokens[0] += server
            self._prompt_tokens[1] += ours
        while self._recent and self._recent[0][0] < now - RECENT_WINDOW_S:
            self._recent.popleft()
        return True

    def prompt_ratio(self) -> float:
        """The server's prompt tokens per token kvgate meant to send (its tokenizer and chat
        template against kvgate's), over the answered requests; 1.0 before any."""
        server, ours = self._prompt_tokens
        return server / ours if ours else 1.0

    def _since(self, window_s: float) -> list[tuple[float, str, float | None]]:
        cutoff = time.monotonic() - window_s
        return [item for item in self._recent if item[0] >= cutoff]

    def recent_cancels(self, window_s: float) -> int:
        return sum(1 for _, outcome, _ in self._since(window_s) if outcome == Outcome.CANCELLED)

    def rate(self, window_s: float = 5.0) -> float:
        return len(self._since(window_s)) / window_s

    def ttft_p95_by_class(self, window_s: float = 30.0) -> dict[str, float]:
        """TTFT p95 (s) per traffic class over the last `window_s` (classes with answers)."""
        cutoff = time.monotonic() - window_s
        out = {}
        for klass, recent in self._recent_ttft.items():
            while recent and recent[0][0] < cutoff:
                recent.popleft()
            if recent:
                out[klass] = percentile([t for _, t in recent], 95)
        return out

    def ttft_p95(self, window_s: float = 30.0) -> float | None:
        values = [t for _, _, t in self._since(window_s) if t is not None]
        return percentile(values, 95) if values else None

    @property
    def rejections(self) -> int:
        return self.outcomes[Outcome.REJECTED]

    @property
    def errors(self) -> int:
        return sum(n for outcome, n in self.outcomes.items() if outcome in FAILED_OUTCOMES)
