"""The reference gateway's admin API, as the replica fault kinds use it (ReplicaAdminAPI):
where a replica's process is, and restarting it."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import gevent

from harness.faults.base import FaultError
from harness.samplers.http import request

RESTART_WAIT_S = 30.0  # how long a restarted replica may take to report "running"
RESTART_ATTEMPTS = 3
RESTART_RETRY_S = 2.0
ADMIN_TIMEOUT_S = 5.0  # a gateway busy tokenizing long prompts can be slow to answer
RESTART_LIMIT_S = 2 * RESTART_WAIT_S + 15  # wait for the death, restart, wait for "running"


class ReplicaAdmin:
    """The gateway's admin API: where a replica's process is, and restarting it."""

    restart_limit_s = RESTART_LIMIT_S

    def __init__(self, gateway_url: str, admin_key: str) -> None:
        self.url = gateway_url.rstrip("/") + "/admin/replicas"
        self.key = admin_key

    def replica(self, replica_id: str) -> dict[str, Any]:
        resp = request(self.url, token=self.key, timeout_s=ADMIN_TIMEOUT_S)
        if resp.status != 200:
            raise FaultError(f"GET /admin/replicas answered HTTP {resp.status}")
        for item in resp.json():
            if item.get("id") == replica_id:
                return dict(item)
        raise FaultError(f"the gateway lists no replica {replica_id!r}")

    def restart(self, replica_id: str) -> None:
        """POST the restart; a 503 (the replica failed while starting) is retried a few times."""
        # the gateway answers a restart once the replica is up, which can take a while
        url = f"{self.url}/{replica_id}/restart"
        problems = []
        for attempt in range(RESTART_ATTEMPTS):
            resp = request(url, method="POST", token=self.key, timeout_s=RESTART_WAIT_S)
            if resp.status < 300:
                return
            problems.append(f"HTTP {resp.status}: {resp.body[:200].decode(errors='replace')}")
            if resp.status != 503 or attempt == RESTART_ATTEMPTS - 1:
                break
            gevent.sleep(RESTART_RETRY_S)
        raise FaultError(f"restart of {replica_id} failed: {'; '.join(problems)}")

    def wait_running(self, replica_id: str, timeout_s: float = RESTART_WAIT_S) -> int | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, FaultError):
                item = self.replica(replica_id)
                if item.get("state") == "running":
                    return item.get("pid")
            gevent.sleep(0.25)
        raise FaultError(f"{replica_id} was not running {timeout_s}s after its restart")

    def wait_dead(self, replica_id: str, timeout_s: float = 10.0) -> None:
        """The gateway must notice the death before it accepts a restart."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, FaultError):
                if self.replica(replica_id).get("state") == "dead":
                    return
            gevent.sleep(0.1)
