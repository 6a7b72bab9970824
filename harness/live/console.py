"""Live console progress (rich): elapsed of planned time, users, req/s, TTFT p95, pool, faults,
and, for a load that runs until its gates are decided, how far each is from a decision.

Runs as a greenlet in the Locust process and refreshes by hand (no rich refresh thread).
Pool usage is read from the tail of `samples.jsonl`, which the sampler process writes, so
no IPC is needed. Without a terminal it prints one plain line every few seconds instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gevent
from rich.console import Console
from rich.live import Live
from rich.table import Table

from contract import servers
from harness.sink import RecordSink

POOL_METRICS = servers.metric_names("kv_usage")  # every server profile's KV-usage gauge
PLAIN_EVERY_S = 10.0


class PoolTail:
    """Follows samples.jsonl and keeps the newest KV-pool usage (0..1) per replica, from
    whichever gauge the target's profile names."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.latest: dict[str, float] = {}

    def update(self) -> float | None:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read(8 * 1024 * 1024)
            end = chunk.rfind(b"\n") + 1  # leave a half-written line for next time
            self.offset += end
            for line in chunk[:end].splitlines():
                if not any(name.encode() in line for name in POOL_METRICS):
                    continue
                row = json.loads(line)
                if row.get("metric") in POOL_METRICS and row.get("value") is not None:
                    self.latest[str(row["target"])] = float(row["value"])
        return max(self.latest.values()) if self.latest else None


@dataclass(slots=True)
class Snapshot:
    phase: str
    elapsed_s: float
    planned_s: float
    users: int
    rps: float
    ttft_p95_s: float | None
    pool_usage: float | None
    requests: int
    rejections: int
    errors: int
    faults: str
    decided: str | None = None  # load.until: decided: the held gates' way to a decision

    def line(self) -> str:
        ttft = f"{self.ttft_p95_s * 1000:.0f} ms" if self.ttft_p95_s is not None else "-"
        pool = f"{self.pool_usage:.0%}" if self.pool_usage is not None else "-"
        decided = f" until=[{self.decided}]" if self.decided else ""
        return (
            f"[{self.phase}] {self.elapsed_s:.0f}/{self.planned_s:.0f}s users={self.users} "
            f"req/s={self.rps:.1f} ttft_p95={ttft} pool={pool} requests={self.requests} "
            f"rejected={self.rejections} errors={self.errors} faults={self.faults}{decided}"
        )

    def table(self) -> Table:
        table = Table(title=f"kvgate run: {self.phase}", show_header=False, expand=False)
        table.add_column(style="bold")
        table.add_column()
        pct = min(1.0, self.elapsed_s / self.planned_s) if self.planned_s else 0.0
        ttft = f"{self.ttft_p95_s * 1000:.0f} ms" if self.ttft_p95_s is not None else "-"
        pool = f"{self.pool_usage:.1%}" if self.pool_usage is not None else "-"
        rows = [
            ("elapsed", f"{self.elapsed_s:.0f}s of {self.planned_s:.0f}s ({pct:.0%})"),
            ("users", str(self.users)),
            ("requests/s", f"{self.rps:.1f} ({self.requests} total)"),
            ("TTFT p95 (30 s)", ttft),
            ("pool usage (max replica)", pool),
            ("rejections", str(self.rejections)),
            ("errors", str(self.errors)),
            ("faults fired", self.faults),
        ]
        if self.decided:
            rows.append(("gates (until decided)", self.decided))
        for name, value in rows:
            table.add_row(name, value)
        return table


class Progress:
    """Owns the progress greenlet; `snapshot` is the single source of what is shown."""

    def __init__(
        self,
        console: Console,
        sink: RecordSink,
        samples_path: Path,
        planned_s: float,
        users: Callable[[], int],
        faults: Callable[[], str],
        decided: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.console = console
        self.sink = sink
        self.pool = PoolTail(samples_path)
        self.planned_s = planned_s
        self.users = users
        self.faults = faults
        self.decided = decided
        self.phase = "starting"
        self.t0 = time.monotonic()
        self._greenlet: gevent.Greenlet[[], None] | None = None
        self._live: Live | None = None
        self._last_line = ""

    def snapshot(self) -> Snapshot:
        return Snapshot(
            phase=self.phase,
            elapsed_s=time.monotonic() - self.t0,
            planned_s=self.planned_s,
            users=self.users(),
            rps=self.sink.rate(),
            ttft_p95_s=self.sink.ttft_p95(),
            pool_usage=self.pool.update(),
            requests=self.sink.total,
            rejections=self.sink.rejections,
            errors=self.sink.errors,
            faults=self.faults(),
            decided=self.decided(),
        )

    def start(self) -> None:
        self.t0 = time.monotonic()
        if self.console.is_terminal:
            self._live = Live(console=self.console, auto_refresh=False, transient=False)
            self._live.start()
        self._greenlet = gevent.spawn(self._loop)

    def _loop(self) -> None:
        last_plain = 0.0
        while True:
            snap = self.snapshot()
            if self._live is not None:
                self._live.update(snap.table(), refresh=True)
            elif time.monotonic() - last_plain >= PLAIN_EVERY_S:
                self._print(snap.line())
                last_plain = time.monotonic()
            gevent.sleep(1.0)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=True, timeout=5)
        snap = self.snapshot()
        if self._live is not None:
            self._live.update(snap.table(), refresh=True)
            self._live.stop()
        elif snap.line() != self._last_line:
            self._print(snap.line())

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        self._last_line = line
