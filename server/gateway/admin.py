"""The gateway's admin API (admin key only) and the ledger audit: list replicas, restart a
dead one, and compare the ledger with the reservations live replicas report."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from aiohttp import web

from server.gateway.ledger import Ledger, drift
from server.gateway.supervisor import ReplicaProc, Supervisor
from server.httputil import json_response
from server.metrics import GatewayMetrics
from server.protocol import ApiError
from server.replica.app import INTERNAL_TOKEN_HEADER
from server.tenants import TenantBook

DRIFT_PERIOD_S = 1.0


class Admin:
    """Owns the control-plane HTTP session to the replicas and the periodic drift audit."""

    def __init__(
        self,
        tenants: TenantBook,
        ledger: Ledger,
        supervisor: Supervisor,
        metrics: GatewayMetrics,
        internal_token: str,
    ) -> None:
        self._tenants = tenants
        self._token = internal_token
        self._ledger = ledger
        self._supervisor = supervisor
        self._metrics = metrics
        self._control: aiohttp.ClientSession | None = None
        self._drift_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._control = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        self._drift_task = asyncio.get_running_loop().create_task(self._drift_loop())

    async def stop(self) -> None:
        if self._drift_task is not None:
            self._drift_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drift_task
        if self._control is not None:
            await self._control.close()

    # -- the ledger against the replicas --------------------------------------------------

    async def ledger_report(self) -> dict[str, object]:
        """Ledger vs the reservations live replicas report (see `ledger.drift`)."""
        before = self._ledger.snapshot()
        running = self._supervisor.running()
        answers = await asyncio.gather(
            *(self._reservations(rep) for rep in running), return_exceptions=True
        )
        after = self._ledger.snapshot()
        live = {
            rep.id: ans for rep, ans in zip(running, answers, strict=True) if isinstance(ans, dict)
        }
        report: dict[str, object] = dict(drift(before, after, live))
        report["requests"] = len(after)
        report["by_replica"] = self._ledger.by_replica()
        report["by_tenant"] = self._ledger.by_tenant()
        report["replicas"] = {r.id: r.state for r in self._supervisor.replicas.values()}
        return report

    async def _reservations(self, rep: ReplicaProc) -> dict[str, int]:
        assert self._control is not None, "Admin.start() first"
        headers = {INTERNAL_TOKEN_HEADER: self._token}
        async with self._control.get(rep.url + "/debug/reservations", headers=headers) as resp:
            data = await resp.json()
        return {str(k): int(v) for k, v in data["reservations"].items()}

    async def _drift_loop(self) -> None:
        while True:
            await asyncio.sleep(DRIFT_PERIOD_S)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                report = await self.ledger_report()
                value = report["drift_tokens"]
                assert isinstance(value, int)
                self._metrics.ledger_drift.set(value)

    # -- handlers -------------------------------------------------------------------------

    async def replicas(self, request: web.Request) -> web.Response:
        self._tenants.require_admin(request.headers.get("Authorization"))
        return json_response([r.public() for r in self._supervisor.replicas.values()])

    async def restart(self, request: web.Request) -> web.Response:
        self._tenants.require_admin(request.headers.get("Authorization"))
        rid = request.match_info["id"]
        rep = self._supervisor.replicas.get(rid)
        if rep is None:
            known = ", ".join(self._supervisor.replicas)
            raise ApiError(404, "not_found", f"no replica '{rid}'; replicas are {known}")
        if rep.state != "dead":
            raise ApiError(
                409,
                "replica_not_dead",
                f"replica {rid} is {rep.state} (pid {rep.pid}); only a dead replica restarts",
            )
        try:
            await self._supervisor.restart(rep)
        except RuntimeError as exc:
            raise ApiError(503, "restart_failed", str(exc), retry_after_s=1) from None
        return json_response(rep.public())

    async def ledger(self, request: web.Request) -> web.Response:
        self._tenants.require_admin(request.headers.get("Authorization"))
        return json_response(await self.ledger_report())
