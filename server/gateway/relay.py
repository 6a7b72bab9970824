"""Forwarding one request to a replica and relaying its answer byte for byte.

The ledger holds the request's reservation for exactly the replica it is on. When that
replica dies: a replayable request (batch) that has sent nothing to the client is retried on
another replica, once, after the death is confirmed (so it never holds two reservations); a
stream that had started ends with an SSE error event and [DONE].
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from server.gateway.ledger import Ledger
from server.gateway.routing import Router
from server.gateway.supervisor import ReplicaProc, Supervisor
from server.gateway.watchdog import HealthProbe, Watchdog
from server.headers import QUEUE_DEADLINE_HEADER
from server.metrics import GatewayMetrics
from server.protocol import ApiError
from server.replica.app import INTERNAL_TOKEN_HEADER
from server.tenants import Identity

DEATH_CONFIRM_S = 1.5  # after a broken upstream, how long to wait for the process to exit
# A replica answers a stream's headers when it admits or rejects it, which the queue
# deadline bounds; past it plus this slack (tokenizing, a slow step) it is not answering.
# The same span is the silence after which the watchdog asks whether the replica is alive.
HEADERS_SLACK_S = 5.0
PASSED_HEADERS = ("Content-Type", "Cache-Control", "X-Request-Id", "X-Kvgate-Replica")
FORWARDED_HEADERS = ("X-Kvgate-Prefix-Tokens", "X-Kvgate-Prefix-Public", "X-Kvgate-Debug-Timing")


@dataclass(slots=True)
class Routed:
    """A validated, authenticated request on its way to a replica."""

    request_id: str  # the client's id, as sent to the replica and echoed
    key: str  # the ledger's key: the id scoped by tenant (ids are unique per tenant)
    identity: Identity
    path: str
    body: bytes
    stream: bool
    tokens: int  # reservation: prompt + effective max_new_tokens
    prefix: str | None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def replayable(self) -> bool:
        return self.identity.priority.value == "batch"


class _UpstreamBroke(Exception):
    """The replica's connection broke mid-request (it may have died)."""


class _UpstreamSilent(Exception):
    """The replica sent no stream headers within the queue deadline plus slack, or went
    silent and stopped answering its health check (the message says which)."""


class Relay:
    """Owns the upstream HTTP session; uses the ledger, router and supervisor it is given."""

    def __init__(
        self,
        ledger: Ledger,
        router: Router,
        supervisor: Supervisor,
        metrics: GatewayMetrics,
        internal_token: str,
        quota_headers: Callable[[str], dict[str, str]],
        queue_deadline_s: float,
    ) -> None:
        self._ledger = ledger
        self._router = router
        self._supervisor = supervisor
        self._metrics = metrics
        self._token = internal_token
        self._quota_headers = quota_headers
        self._queue_deadline_s = queue_deadline_s
        self._session: aiohttp.ClientSession | None = None
        self._probe: HealthProbe | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
        )
        self._probe = HealthProbe(self._session)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request, r: Routed) -> web.StreamResponse:
        tried: set[str] = set()
        # The queue deadline belongs to the request, not to one replica: a retry after a
        # replica died gets what is left of it, so the client hears within the deadline.
        expires = time.monotonic() + self._queue_deadline_s
        while True:
            left_s = expires - time.monotonic()
            if tried and left_s <= 0:
                raise ApiError(
                    503,
                    "deadline_expired",
                    "the replica serving this request died and its queue deadline passed "
                    "before another could start it; retry",
                    retry_after_s=1,
                )
            rep = self._pick(r, tried)
            self._ledger.reserve(r.key, r.identity.tenant, r.identity.priority, rep.id, r.tokens)
            try:
                return await self._forward(request, r, rep, max(left_s, 0.001))
            except _UpstreamBroke as exc:
                if not await self._may_retry(r, rep, tried):
                    raise ApiError(
                        503,
                        "replica_failed",
                        f"replica {rep.id} failed while handling the request ({exc}); retry",
                        retry_after_s=1,
                    ) from None
                self._metrics.retries.inc()
            except _UpstreamSilent as exc:
                raise ApiError(
                    503, "replica_failed", f"replica {rep.id} {exc}; retry", retry_after_s=1
                ) from None
            finally:
                self._ledger.release(r.key, rep.id)

    def _pick(self, r: Routed, tried: set[str]) -> ReplicaProc:
        running = [p.id for p in self._supervisor.running() if p.id not in tried]
        rid = self._router.pick(running, self._ledger.by_replica(), r.prefix)
        if rid is None:
            raise ApiError(
                503,
                "capacity",
                "no replica is running to serve this request; retry shortly",
                retry_after_s=2,
            )
        return self._supervisor.replicas[rid]

    async def _may_retry(self, r: Routed, rep: ReplicaProc, tried: set[str]) -> bool:
        """Retry once, only replayable work, only once the replica is known to be dead."""
        if not r.replayable or tried:
            return False
        try:
            await asyncio.wait_for(rep.died.wait(), DEATH_CONFIRM_S)
        except TimeoutError:
            return False
        tried.add(rep.id)
        self._drop_hold(r, rep)
        return bool([p for p in self._supervisor.running() if p.id not in tried])

    def _drop_hold(self, r: Routed, rep: ReplicaProc) -> None:
        """The dead replica's reservation of `r` leaves the ledger before the retry's."""
        self._ledger.release(r.key, rep.id)

    def _headers_timeout(self, r: Routed, timeout_s: float) -> float | None:
        """How long to wait for the replica's response headers (None: no limit). A stream's
        come at admission or refusal, which its queue deadline bounds; a non-streaming
        answer's only at its end."""
        return timeout_s if r.stream else None

    async def _forward(
        self, request: web.Request, r: Routed, rep: ReplicaProc, deadline_s: float
    ) -> web.StreamResponse:
        assert self._session is not None and self._probe is not None
        headers = {
            **r.headers,
            INTERNAL_TOKEN_HEADER: self._token,
            "X-Kvgate-Tenant": r.identity.tenant,
            "X-Kvgate-Priority": r.identity.priority.value,
            QUEUE_DEADLINE_HEADER: str(max(1, round(deadline_s * 1000))),
            "X-Request-Id": r.request_id,
            "Content-Type": "application/json",
        }
        headers_timeout_s = deadline_s + HEADERS_SLACK_S
        limit = asyncio.timeout(self._headers_timeout(r, headers_timeout_s))
        watch = Watchdog(self._probe, rep.url + "/health", headers_timeout_s)
        try:
            with watch:
                async with limit:
                    watch.target = limit
                    try:
                        return await self._exchange(request, r, rep, headers, limit, watch)
                    finally:
                        watch.target = None
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise _UpstreamBroke(type(exc).__name__) from None
        except TimeoutError:
            if not limit.expired():
                raise
            if watch.fired:
                raise _UpstreamSilent("went silent and does not answer its health check") from None
            raise _UpstreamSilent(
                f"sent no response within {headers_timeout_s:.3g} s (queue deadline plus slack)"
            ) from None

    async def _exchange(
        self,
        request: web.Request,
        r: Routed,
        rep: ReplicaProc,
        headers: dict[str, str],
        limit: asyncio.Timeout,
        watch: Watchdog,
    ) -> web.StreamResponse:
        assert self._session is not None
        async with self._session.post(rep.url + r.path, data=r.body, headers=headers) as up:
            limit.reschedule(None)  # admitted or rejected: from here the stream sets the pace
            self._ledger.ack(r.key, rep.id)
            watch.touch()
            if up.status != 200 or not r.stream:
                body = await up.read()
                return web.Response(body=body, status=up.status, headers=self._headers(up, r))
            return await self._relay_stream(request, r, rep, up, watch)

    async def _relay_stream(
        self,
        request: web.Request,
        r: Routed,
        rep: ReplicaProc,
        up: aiohttp.ClientResponse,
        watch: Watchdog,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=self._headers(up, r))
        chunks = up.content.iter_any().__aiter__()
        stall = asyncio.timeout(None)  # the watchdog expires it if the replica hangs
        try:
            await resp.prepare(request)
            async with stall:
                watch.target = stall
                try:
                    while True:
                        try:
                            chunk = await chunks.__anext__()
                        except StopAsyncIteration:
                            break
                        except (aiohttp.ClientError, ConnectionError):  # the replica broke
                            await self._end_broken_stream(resp, rep)
                            return resp
                        watch.touch()
                        await resp.write(chunk)
                finally:
                    watch.target = None
            await resp.write_eof()
        except ConnectionResetError:
            pass  # our client left; leaving `up` closes the upstream, which cancels there
        except TimeoutError:
            if not stall.expired():
                raise
            await self._end_broken_stream(resp, rep)  # hung replica: end it as a failure
        return resp

    async def _end_broken_stream(self, resp: web.StreamResponse, rep: ReplicaProc) -> None:
        err = {
            "error": {
                "message": f"replica {rep.id} failed while streaming this response; the output "
                f"is incomplete, send the request again",
                "type": "server_error",
                "code": "replica_failed",
            }
        }
        payload = b"\n\ndata: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n"
        try:
            await resp.write(payload)
            await resp.write_eof()
        except ConnectionResetError:
            return

    def _headers(self, up: aiohttp.ClientResponse, r: Routed) -> dict[str, str]:
        out = {k: up.headers[k] for k in PASSED_HEADERS if k in up.headers}
        if "Retry-After" in up.headers:
            out["Retry-After"] = up.headers["Retry-After"]
        out.update(self._quota_headers(r.identity.tenant))
        return out
