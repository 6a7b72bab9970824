"""The gateway's HTTP app: authenticates, tokenizes, checks the tenant's global quota,
routes, and relays; plus health, models, metrics, the aggregated event log and admin."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Literal

from aiohttp import web

from server.gateway.admin import Admin
from server.gateway.events import read_events
from server.gateway.ledger import Ledger
from server.gateway.relay import FORWARDED_HEADERS, Relay, Routed
from server.gateway.routing import Router, prefix_key
from server.gateway.supervisor import ReplicaProc, Supervisor, child_env
from server.httputil import api_errors, error_response, json_response, read_body
from server.metrics import CONTENT_TYPE, GatewayMetrics
from server.options import engine_argv, load_config, target_info
from server.protocol import ApiError, ParsedRequest, model_not_found, parse_body, request_id
from server.tenants import Identity, load_tenants
from server.tokenizer import TextTokenizer, render_chat

LONG_TEXT_CHARS = 16_384


class Gateway:
    """Composition root of the gateway process: tenants, ledger, router, supervisor, relay."""

    def __init__(self, args: argparse.Namespace, state_dir: Path, internal_token: str) -> None:
        self.config = load_config(args)
        self.info = {**target_info(args, self.config), "replicas": args.replicas}
        self.model_name = self.config.model
        self.tenants = load_tenants(args.tenants)
        self.tokenizer = TextTokenizer(args.tokenizer)
        self.state_dir = state_dir
        self.started = int(time.time())
        self.metrics = GatewayMetrics()
        self.ledger = Ledger(self.tenants.quotas)
        self.router = Router()
        ids = [f"r{i}" for i in range(args.replicas)]
        self.supervisor = Supervisor(
            ids,
            engine_argv(args),
            state_dir,
            child_env(internal_token),
            self._on_death,
            host=args.host,
        )
        self.relay = Relay(
            self.ledger,
            self.router,
            self.supervisor,
            self.metrics,
            internal_token,
            self.ledger.quota_headers,
            self.config.queue_deadline_ms / 1000,
        )
        self.admin = Admin(self.tenants, self.ledger, self.supervisor, self.metrics)

    async def start(self) -> None:
        await self.relay.start()
        await self.supervisor.start_all()
        await self.admin.start()

    async def stop(self) -> None:
        await self.admin.stop()
        await self.supervisor.stop_all()
        await self.relay.close()

    def _on_death(self, rep: ReplicaProc) -> None:
        self.ledger.drop_replica(rep.id)

    # -- requests -------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat", "/v1/chat/completions")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completion", "/v1/completions")

    async def _complete(
        self, request: web.Request, kind: Literal["chat", "completion"], path: str
    ) -> web.StreamResponse:
        try:
            rid = request_id(request.headers.get("X-Request-Id"))
        except ApiError as err:
            return error_response(err)
        tenant: str | None = None
        try:
            identity = self.tenants.authenticate(
                request.headers.get("Authorization"), request.headers.get("X-Priority")
            )
            tenant = identity.tenant
            routed = await self._route(request, rid, identity, kind, path)
            return await self.relay.handle(request, routed)
        except ApiError as err:
            self.metrics.rejections.labels(err.code, tenant or "").inc()
            headers = {"X-Request-Id": rid}
            if tenant is not None:
                headers.update(self.ledger.quota_headers(tenant))
            return error_response(err, headers)

    async def _route(
        self,
        request: web.Request,
        rid: str,
        identity: Identity,
        kind: Literal["chat", "completion"],
        path: str,
    ) -> Routed:
        body = await read_body(request)
        parsed = parse_body(kind, body)
        if parsed.model != self.model_name:
            raise model_not_found(parsed.model, self.model_name)
        tokens = await self._tokens(parsed)
        max_new = parsed.max_tokens or self.config.max_new_tokens_default
        total = len(tokens) + max_new
        self._check_context(identity.tenant, len(tokens), max_new, parsed.max_tokens is None)
        if self.ledger.holds(rid):
            raise ApiError(
                400,
                "invalid_request",
                f"request id '{rid}' is already in flight; send a unique X-Request-Id",
            )
        self.ledger.check(identity.tenant, identity.priority, total)
        return Routed(
            request_id=rid,
            identity=identity,
            path=path,
            body=body,
            stream=parsed.stream,
            tokens=total,
            prefix=self._prefix_key(request, identity.tenant, tokens),
            headers={h: request.headers[h] for h in FORWARDED_HEADERS if h in request.headers},
        )

    def _check_context(self, tenant: str, prompt: int, max_new: int, default: bool) -> None:
        total = prompt + max_new
        asked = f"the default max_tokens ({max_new})" if default else f"max_tokens ({max_new})"
        for limit, whose in (
            (self.tenants.quotas[tenant].max_context_tokens, "your tenant's"),
            (self.config.profile.max_context, f"model {self.model_name}'s"),
        ):
            if total > limit:
                raise ApiError(
                    400,
                    "too_long",
                    f"input ({prompt} tokens) plus {asked} exceeds {whose} "
                    f"{limit}-token context limit; shorten the input or lower max_tokens",
                )

    async def _tokens(self, parsed: ParsedRequest) -> list[int]:
        if parsed.prompt_ids is not None:
            return parsed.prompt_ids
        text = render_chat(parsed.messages) if parsed.kind == "chat" else parsed.prompt_text or ""
        if not text:
            raise ApiError(400, "invalid_request", "'prompt' is empty; send at least one token")
        if len(text) > LONG_TEXT_CHARS:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, self.tokenizer.encode_nogil, text)
        return self.tokenizer.encode(text)

    def _prefix_key(self, request: web.Request, tenant: str, tokens: list[int]) -> str | None:
        raw = request.headers.get("X-Kvgate-Prefix-Tokens")
        if raw is None:
            return None
        if not raw.isdigit():
            raise ApiError(
                400,
                "invalid_request",
                f"X-Kvgate-Prefix-Tokens must be a non-negative integer (got '{raw}')",
            )
        n = min(int(raw), len(tokens))
        public = request.headers.get("X-Kvgate-Prefix-Public") == "1"
        return prefix_key(tenant, public, tokens[:n]) if n else None

    # -- observability --------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        states = {r.id: r.state for r in self.supervisor.replicas.values()}
        ok = any(s == "running" for s in states.values())
        return json_response(
            {"status": "ok" if ok else "degraded", "replicas": states}, status=200 if ok else 503
        )

    async def info_endpoint(self, request: web.Request) -> web.Response:
        return json_response(self.info)

    async def models(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": self.started,
                        "owned_by": "kvgate",
                    }
                ],
            }
        )

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        self.metrics.ledger_reserved.clear()
        for tenant in self.tenants.quotas:
            self.metrics.ledger_reserved.labels(tenant).set(self.ledger.tenant_tokens(tenant))
        for rep in self.supervisor.replicas.values():
            self.metrics.replica_up.labels(rep.id).set(1 if rep.state == "running" else 0)
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def events(self, request: web.Request) -> web.Response:
        body, cursor = read_events(self.state_dir, request.query.get("after", ""))
        return web.Response(
            body=body, content_type="application/x-ndjson", headers={"X-Next-Cursor": cursor}
        )


def build_app(gw: Gateway) -> web.Application:
    app = web.Application(middlewares=[api_errors])
    app.router.add_post("/v1/chat/completions", gw.chat)
    app.router.add_post("/v1/completions", gw.completions)
    app.router.add_get("/v1/models", gw.models)
    app.router.add_get("/health", gw.health)
    app.router.add_get("/info", gw.info_endpoint)
    app.router.add_get("/debug/info", gw.info_endpoint)
    app.router.add_get("/metrics", gw.metrics_endpoint)
    app.router.add_get("/debug/events", gw.events)
    app.router.add_get("/admin/replicas", gw.admin.replicas)
    app.router.add_post("/admin/replicas/{id}/restart", gw.admin.restart)
    app.router.add_get("/admin/ledger", gw.admin.ledger)
    return app
