"""The replica's per-request event log: a cursor-readable memory window plus an append-only
JSON-lines file in the state dir (`<state-dir>/<replica-id>.events.jsonl`).

Each row is a `contract.ServerEvent`. `seq` is per replica and keeps
counting across restarts (it resumes from the file), so (replica, seq) names a row for good.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Iterable
from itertools import islice
from pathlib import Path

from contract import EventKind, ServerEvent
from server.headers import client_id
from server.scheduler import Event

MEMORY_ROWS = 200_000  # older rows stay in the file only


def events_path(state_dir: Path, replica_id: str) -> Path:
    return state_dir / f"{replica_id}.events.jsonl"


def count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as fh:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))


class EventLog:
    """Owns the replica's event rows. Invariant: rows in memory are a contiguous suffix of the
    file, in seq order, and every row is written to the file before it is readable here."""

    def __init__(self, replica_id: str, state_dir: Path) -> None:
        self.replica_id = replica_id
        self.path = events_path(state_dir, replica_id)
        state_dir.mkdir(parents=True, exist_ok=True)
        self._seq = count_lines(self.path)
        self._rows: deque[tuple[int, bytes]] = deque(maxlen=MEMORY_ROWS)
        self._fh = self.path.open("ab")

    def append_events(self, events: Iterable[Event]) -> None:
        lines = []
        for ev in events:
            row = ServerEvent(
                t=ev.t,
                replica=self.replica_id,
                seq=self._seq,
                # The scheduler keys requests by tenant-scoped id; a row names the client's id
                # (its tenant is the next column).
                request_id=client_id(ev.request_id),
                tenant=ev.tenant,
                priority=ev.priority,
                event=ev.event,
                blocks=ev.blocks,
                reserved_tokens=ev.reserved_tokens,
                used_tokens=ev.used_tokens,
                reason=ev.reason,
                pool_used_blocks=ev.pool_used_blocks,
                pool_total_blocks=ev.pool_total_blocks,
            )
            lines.append(self._encode(row))
        self._flush(lines)

    def append_lifecycle(self, event: EventKind, reason: str | None = None) -> None:
        row = ServerEvent.lifecycle(time.time(), self.replica_id, self._seq, event, reason)
        self._flush([self._encode(row)])

    def _encode(self, row: ServerEvent) -> bytes:
        line = json.dumps(row.row(), separators=(",", ":")).encode() + b"\n"
        self._rows.append((self._seq, line))
        self._seq += 1
        return line

    def _flush(self, lines: list[bytes]) -> None:
        if lines:
            self._fh.write(b"".join(lines))
            self._fh.flush()

    def read_after(self, cursor: int, limit: int = 10_000) -> tuple[bytes, int]:
        """JSON lines with seq > cursor (at most `limit`), and the cursor to pass next time."""
        if not self._rows:
            return b"", cursor
        start = max(cursor + 1 - self._rows[0][0], 0)
        rows = list(islice(self._rows, start, start + limit))
        if not rows:
            return b"", cursor
        return b"".join(line for _, line in rows), rows[-1][0]

    def close(self) -> None:
        self._fh.close()
