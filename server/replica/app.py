"""The replica's HTTP app: OpenAI endpoints on top of the step loop, plus health, metrics,
events and the virtual GPU.

Identity comes from the gateway's internal headers, checked against the deployment's secret
(a replica started by serve takes nothing else, so no client can bypass the gateway's global
ledger); a standalone replica, started without a secret, authenticates API keys itself.
Observability endpoints take the admin key or the internal credential.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from server.headers import (
    QUEUE_DEADLINE_HEADER,
    ClientHeaders,
    client_headers,
    parse_offset,
    queue_deadline_ms,
    request_id,
    same_secret,
    scoped_key,
)
from server.httputil import api_errors, error_response, json_response, read_body
from server.metrics import CONTENT_TYPE
from server.promptwork import ContextLimit
from server.protocol import ApiError, ParsedRequest, model_not_found
from server.replica.loop import StepLoop
from server.replica.runtime import ReplicaRuntime
from server.replica.streams import Stream, StreamSpec
from server.scheduler import Decision, PrefixSpec, Priority, SeqRequest
from server.tenants import Identity

INTERNAL_TOKEN_HEADER = "X-Kvgate-Internal-Token"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(slots=True)
class _Prepared:
    identity: Identity
    headers: ClientHeaders
    parsed: ParsedRequest
    tokens: list[int]
    prefix: PrefixSpec | None
    deadline_ms: int | None  # the gateway's remaining queue deadline (None: the config's)


class ReplicaHandlers:
    """Request handlers; everything they share hangs off the runtime."""

    def __init__(self, rt: ReplicaRuntime) -> None:
        self.rt = rt
        self.loop: StepLoop = rt.loop

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completion")

    async def _complete(
        self, request: web.Request, kind: Literal["chat", "completion"]
    ) -> web.StreamResponse:
        try:
            rid = request_id(request.headers.get("X-Request-Id"))
        except ApiError as err:
            return error_response(err)
        headers = {"X-Request-Id": rid, "X-Kvgate-Replica": self.rt.replica_id}
        tenant = None
        stream: Stream | None = None
        try:
            await self.loop.pacer.turn()
            prep = await self._prepare(request, kind)
            tenant = prep.identity.tenant
            stream = self._new_stream(prep)
            await self._admit(stream, prep)
            headers.update(self._quota_headers(tenant))
            if prep.parsed.stream:
                return await self._stream(request, stream, headers)
            await stream.wait_done()
            if stream.aborted:
                raise ApiError(503, "capacity", "the request was dropped before it finished; retry")
            return json_response(stream.response_body(), headers=headers)
        except ApiError as err:
            return error_response(err, {**headers, **self._quota_headers(tenant)})
        finally:
            # However the handler ends (disconnect -> CancelledError, reset, error), a request
            # that has not finished gives its blocks back now.
            if stream is not None and not stream.closed:
                self.loop.cancel(stream)

    async def _prepare(
        self, request: web.Request, kind: Literal["chat", "completion"]
    ) -> _Prepared:
        hdrs = client_headers(request.headers)
        identity = self._identity(request, hdrs)
        parsed = await self.rt.prompts.parse(kind, await read_body(request))
        if parsed.model != self.rt.model_name:
            raise model_not_found(parsed.model, self.rt.model_name)
        tokens = await self._tokens(parsed, identity.tenant)
        prefix = self._prefix(hdrs, len(tokens), kind)
        return _Prepared(identity, hdrs, parsed, tokens, prefix, self._deadline_ms(request))

    def _deadline_ms(self, request: web.Request) -> int | None:
        """The gateway's remaining deadline, within (0, the configured one]; else None."""
        if request.headers.get(INTERNAL_TOKEN_HEADER) is None:
            return None
        raw = request.headers.get(QUEUE_DEADLINE_HEADER)
        return queue_deadline_ms(raw, self.rt.config.queue_deadline_ms)

    def _new_stream(self, prep: _Prepared) -> Stream:
        spec = StreamSpec(
            request_id=scoped_key(prep.identity.tenant, prep.headers.request_id),
            client_id=prep.headers.request_id,
            tenant=prep.identity.tenant,
            priority=prep.identity.priority,
            kind=prep.parsed.kind,
            model=self.rt.model_name,
            stream=prep.parsed.stream,
            include_usage=prep.parsed.include_usage,
            continuous_usage=prep.parsed.continuous_usage,
            debug_timing=prep.headers.debug_timing,
            prompt_tokens=len(prep.tokens),
            ignore_eos=prep.parsed.ignore_eos,
            min_tokens=prep.parsed.min_tokens,
        )
        return Stream(spec, self.rt.tokenizer.output_json)

    async def _admit(self, stream: Stream, prep: _Prepared) -> None:
        """Submit; wait in the queue if told to. Raises ApiError for a rejection."""
        req = SeqRequest(
            request_id=stream.spec.request_id,
            tenant=prep.identity.tenant,
            priority=prep.identity.priority,
            prompt_tokens=tuple(prep.tokens),
            max_new_tokens=prep.parsed.max_tokens,
            prefix=prep.prefix,
            replayable=prep.identity.priority is Priority.BATCH,
            deadline_ms=prep.deadline_ms,
        )
        adm = self.loop.submit(stream, req)
        if adm.outcome is Decision.REJECT:
            code = adm.reason.value if adm.reason else "capacity"
            raise ApiError(adm.http_status, code, adm.message, adm.retry_after_s)
        if adm.outcome is Decision.QUEUE:
            await stream.admitted

    async def _stream(
        self, request: web.Request, stream: Stream, headers: dict[str, str]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={**SSE_HEADERS, **headers})
        try:
            await resp.prepare(request)
            # The role chunk goes out with the headers; completions have none: headers only.
            await resp.write(stream.role_chunk() if stream.spec.kind == "chat" else b"")
        except ConnectionResetError:
            return resp  # the client left while queued; the caller releases the request
        transport = request.transport
        stream.attach(transport)
        await stream.wait_done()
        if stream.aborted:
            # Cut the connection: a clean end of the chunked body would read as complete.
            if transport is not None:
                transport.abort()
        elif transport is not None and not transport.is_closing():
            await resp.write_eof()
        return resp

    def _identity(self, request: web.Request, hdrs: ClientHeaders) -> Identity:
        token = request.headers.get(INTERNAL_TOKEN_HEADER)
        secret = self.rt.internal_token
        if token is None and not secret:  # standalone: the replica is the front door
            return self.rt.tenants.authenticate(request.headers.get("Authorization"), hdrs.priority)
        if token is None:
            raise ApiError(
                401,
                "invalid_api_key",
                f"replica {self.rt.replica_id} serves only its gateway; send the request to "
                f"the gateway's URL with your API key",
            )
        if not same_secret(token, secret):
            raise ApiError(
                401, "invalid_api_key", "internal token does not match this deployment's secret"
            )
        tenant = request.headers.get("X-Kvgate-Tenant", "")
        if tenant not in self.rt.tenants.quotas:
            raise ApiError(401, "invalid_api_key", f"gateway named unknown tenant '{tenant}'")
        try:
            priority = Priority(request.headers.get("X-Kvgate-Priority", ""))
        except ValueError:
            raise ApiError(400, "invalid_request", "gateway sent no valid priority") from None
        return Identity(tenant, priority)

    async def _tokens(self, parsed: ParsedRequest, tenant: str) -> list[int]:
        tok = self.rt.tokenizer
        if parsed.prompt_ids is not None:
            bad = [t for t in parsed.prompt_ids if not 0 <= t < tok.vocab_size]
            if bad:
                raise ApiError(
                    400,
                    "invalid_request",
                    f"prompt token id {bad[0]} is outside the vocabulary (0..{tok.vocab_size - 1})",
                )
        config = self.rt.config
        limits = (
            ContextLimit(self.rt.tenants.quotas[tenant].max_context_tokens, "your tenant's"),
            ContextLimit(config.profile.max_context, f"model {self.rt.model_name}'s"),
        )
        max_new = parsed.max_tokens or config.max_new_tokens_default
        # Only the free lower bound here: the scheduler judges (and counts) the exact length.
        return await self.rt.prompts.tokens(parsed, max_new, limits, exact=False)

    def _prefix(self, hdrs: ClientHeaders, n_tokens: int, kind: str) -> PrefixSpec | None:
        length = min(hdrs.prefix_tokens or 0, n_tokens)
        if length == 0:
            return None
        return PrefixSpec(
            length=length,
            public=hdrs.prefix_public,
            model=self.rt.model_name,
            tokenizer=self.rt.tokenizer.name,
            adapter="",
            chat_template="kvgate-chat-v1" if kind == "chat" else "none",
        )

    def _quota_headers(self, tenant: str | None) -> dict[str, str]:
        if tenant is None or tenant not in self.rt.tenants.quotas:
            return {}
        limit = self.rt.tenants.quotas[tenant].hard_reserved_tokens
        reserved = self.loop.tenant_reserved.get(tenant, 0)
        return {
            "X-Kvgate-Quota-Reserved-Tokens": str(reserved),
            "X-Kvgate-Quota-Limit-Tokens": str(limit),
            "X-Kvgate-Quota-Remaining-Tokens": str(max(limit - reserved, 0)),
        }

    # -- observability --------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "status": "ok",
                "replica": self.rt.replica_id,
                "policy": self.rt.policy,
                "model": self.rt.model_name,
                "gpu": self.rt.gpu.sku.name,
            }
        )

    def _observer(self, request: web.Request) -> None:
        """Observability endpoints: the admin key, or the gateway's internal credential."""
        token = request.headers.get(INTERNAL_TOKEN_HEADER)
        if token is not None and same_secret(token, self.rt.internal_token):
            return
        self.rt.tenants.require_admin(request.headers.get("Authorization"), request.path)

    async def info(self, request: web.Request) -> web.Response:
        self._observer(request)
        return json_response(self.rt.info)

    async def models(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.rt.model_name,
                        "object": "model",
                        "created": self.rt.started,
                        "owned_by": "kvgate",
                    }
                ],
            }
        )

    async def metrics(self, request: web.Request) -> web.Response:
        self._observer(request)
        return web.Response(body=self.rt.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def events(self, request: web.Request) -> web.Response:
        self._observer(request)
        raw = request.query.get("after") or "-1"
        cursor = -1 if raw == "-1" else parse_offset(raw, "after")
        body, nxt = self.rt.events.read_after(cursor)
        return web.Response(
            body=body, content_type="application/x-ndjson", headers={"X-Next-Cursor": str(nxt)}
        )

    async def gpu(self, request: web.Request) -> web.Response:
        self._observer(request)
        g = self.rt.gpu
        return json_response(
            {
                "total_bytes": g.total_bytes,
                "used_bytes": g.used_bytes,
                "by_category": g.by_category(),
                "sku": g.sku.name,
            }
        )

    async def reservations(self, request: web.Request) -> web.Response:
        self._observer(request)
        return json_response(
            {
                "replica": self.rt.replica_id,
                "t": time.time(),
                "reservations": self.loop.reservations(),
            }
        )

    async def steps(self, request: web.Request) -> web.Response:
        self._observer(request)
        return json_response(self.loop.stats.snapshot(request.query.get("lags") == "1"))


def build_app(rt: ReplicaRuntime) -> web.Application:
    h = ReplicaHandlers(rt)
    app = web.Application(middlewares=[api_errors])
    app.router.add_post("/v1/chat/completions", h.chat)
    app.router.add_post("/v1/completions", h.completions)
    app.router.add_get("/v1/models", h.models)
    app.router.add_get("/health", h.health)
    app.router.add_get("/info", h.info)
    app.router.add_get("/debug/info", h.info)
    app.router.add_get("/metrics", h.metrics)
    app.router.add_get("/debug/events", h.events)
    app.router.add_get("/debug/gpu", h.gpu)
    app.router.add_get("/debug/reservations", h.reservations)
    app.router.add_get("/debug/steps", h.steps)
    return app
