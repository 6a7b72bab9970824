"""Server event collection: the gateway's `/debug/events` cursor and replica lifecycle rows.

`EventCollector` follows the gateway's aggregated event log (all replicas, dead ones
included) with its cursor and persists every event as it arrives. `LifecycleMonitor` polls
`/admin/replicas` and writes `replica_started` / `replica_died` rows (the death's reason says
whether it was an OOM), also when
a restart happened between two polls. Both keep `ReplicaTable` current, so the other
samplers follow a restarted replica's new PID.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from contract import SERVER_EVENT_COLUMNS, EventKind, ServerEvent
from harness.samplers.http import Response, request
from harness.samplers.prometheus import Endpoint, Row

MAX_PAGES_PER_TICK = 50  # bounds one drain; the next tick continues from the cursor


@dataclass(slots=True)
class Replica:
    id: str
    url: str
    pid: int | None
    state: str = "running"
    restarts: int = 0


class ReplicaTable:
    """The replicas as last seen; shared by the sampler threads (guarded by a lock)."""

    def __init__(self, replicas: list[Replica]) -> None:
        self._lock = threading.Lock()
        self._replicas = {r.id: r for r in replicas}

    def all(self) -> list[Replica]:
        with self._lock:
            return [
                Replica(r.id, r.url, r.pid, r.state, r.restarts) for r in self._replicas.values()
            ]

    def update(self, replica: Replica) -> None:
        with self._lock:
            self._replicas[replica.id] = replica

    def endpoints(self) -> list[Endpoint]:
        """Replicas worth scraping: running ones (a dead one would only time out)."""
        return [Endpoint(r.id, r.url) for r in self.all() if r.state == "running"]

    def pids(self) -> set[int]:
        return {r.pid for r in self.all() if r.pid is not None and r.state == "running"}


class EventCollector:
    """Drains `GET /debug/events?after=CURSOR` into rows; the cursor only moves forward.
    The reference server shows every tenant's rows only to the admin key."""

    def __init__(
        self,
        gateway_url: str,
        fetch: Callable[..., Response] = request,
        token: str | None = None,
    ) -> None:
        self._url = gateway_url.rstrip("/") + "/debug/events"
        self._fetch = fetch
        self._token = token
        self.cursor: str | None = None
        self.errors = 0

    def poll(self) -> list[Row]:
        rows: list[Row] = []
        for _ in range(MAX_PAGES_PER_TICK):
            query = "" if self.cursor is None else "?after=" + urllib.parse.quote(self.cursor)
            try:
                resp = self._fetch(self._url + query, token=self._token)
            except OSError:
                self.errors += 1
                break
            if resp.status != 200:
                self.errors += 1
                break
            page = [json.loads(line) for line in resp.body.splitlines() if line.strip()]
            rows.extend({f: event.get(f) for f in SERVER_EVENT_COLUMNS} for event in page)
            next_cursor = resp.headers.get("x-next-cursor")
            if next_cursor is not None:
                self.cursor = next_cursor
            if not page or next_cursor is None:
                break
        return rows


def lifecycle_row(t: float, replica: str, seq: int, event: EventKind, reason: str | None) -> Row:
    return ServerEvent.lifecycle(t, replica, seq, event, reason).row()


class LifecycleMonitor:
    """Turns `/admin/replicas` state changes into lifecycle rows.

    Harness-made rows carry negative `seq` numbers (-1, -2, ...) so they never collide
    with the server's own per-replica sequence numbers.
    """

    def __init__(
        self,
        gateway_url: str,
        admin_key: str,
        table: ReplicaTable,
        is_oom: Callable[[str, int | None], bool],
        fetch: Callable[..., Response] = request,
    ) -> None:
        self._url = gateway_url.rstrip("/") + "/admin/replicas"
        self._key = admin_key
        self._table = table
        self._is_oom = is_oom
        self._fetch = fetch
        self._seq = 0
        self._started_written = False

    def _next_seq(self) -> int:
        self._seq -= 1
        return self._seq

    def poll(self) -> list[Row]:
        try:
            resp = self._fetch(self._url, token=self._key)
            listing = resp.json() if resp.status == 200 else None
        except (OSError, ValueError):
            listing = None
        if not isinstance(listing, list):
            return []
        t = time.time()
        rows: list[Row] = []
        known = {r.id: r for r in self._table.all()}
        for item in listing:
            now = Replica(
                str(item["id"]),
                str(item.get("url") or known.get(str(item["id"]), Replica("", "", None)).url),
                item.get("pid"),
                str(item.get("state", "running")),
                int(item.get("restarts") or 0),
            )
            rows.extend(self._transition(t, known.get(now.id), now, item.get("exit_code")))
            self._table.update(now)
        self._started_written = True
        return rows

    def _transition(
        self, t: float, before: Replica | None, now: Replica, exit_code: int | None
    ) -> list[Row]:
        rows: list[Row] = []
        if before is None or not self._started_written:
            if now.state == "running":
                rows.append(
                    lifecycle_row(
                        t, now.id, self._next_seq(), EventKind.REPLICA_STARTED, "harness: running"
                    )
                )
            return rows
        restarted = now.restarts > before.restarts
        died = before.state == "running" and (now.state == "dead" or restarted)
        if died:
            rows.extend(self._died(t, now.id, exit_code))
        if now.state == "running" and (restarted or before.state != "running"):
            reason = f"harness: restart {now.restarts}" if restarted else "harness: running"
            rows.append(
                lifecycle_row(t, now.id, self._next_seq(), EventKind.REPLICA_STARTED, reason)
            )
        return rows

    def _died(self, t: float, replica: str, exit_code: int | None) -> list[Row]:
        # the replica logs its own `oom` row before it exits; the death row says why it died
        oom = self._is_oom(replica, exit_code)
        reason = f"harness: exit_code={exit_code}" + (" oom (CUDA out of memory)" if oom else "")
        return [lifecycle_row(t, replica, self._next_seq(), EventKind.REPLICA_DIED, reason)]
