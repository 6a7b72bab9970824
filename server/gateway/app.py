"""The gateway's HTTP app: authenticates, tokenizes, checks the tenant's global quota,
routes, and relays; plus health, models, metrics, the aggregated event log and admin."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Literal

from aiohttp import web

from server.gateway.admin import Admin
from server.gateway.events import read_events
from server.gateway.ledger import Ledger
from server.gateway.mutants import relay_class
from server.gateway.relay import FORWARDED_HEADERS, Routed
from server.gateway.routing import Router, prefix_key
from server.gateway.supervisor import ReplicaProc, Supervisor, child_env
from server.headers import ClientHeaders, client_headers, scoped_key
from server.httputil import api_errors, error_response, json_response, read_body
from server.metrics import CONTENT_TYPE, GatewayMetrics
from server.mutants import tenant_book_class
from server.options import engine_argv, load_config, target_info
from server.promptwork import ContextLimit, PromptTokenizer
from server.protocol import ApiError, model_not_found
from server.scheduler.mutants import parse_mutant
from server.tenants import Identity, load_tenants
from server.tokenizer import TextTokenizer


class Gateway:
    """Composition root of the gateway process: tenants, ledger, router, supervisor, relay."""

    def __init__(self, args: argparse.Namespace, state_dir: Path, internal_token: str) -> None:
        self.config = load_config(args)
        self.info = {**target_info(args, self.config), "replicas": args.replicas}
        self.model_name = self.config.model
        mutant = parse_mutant(args.mutant)  # a named bug: the mutant's subclass of each part
        self.tenants = load_tenants(args.tenants, tenant_book_class(mutant))
        self.tokenizer = TextTokenizer(args.tokenizer)
        self.prompts = PromptTokenizer(self.tokenizer)
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
        self.relay = relay_class(mutant)(
            self.ledger,
            self.router,
            self.supervisor,
            self.metrics,
            internal_token,
            self.ledger.quota_headers,
            self.config.queue_deadline_ms / 1000,
        )
        self.admin = Admin(self.tenants, self.ledger, self.supervisor, self.metrics, internal_token)

    async def start(self) -> None:
        await self.relay.start()
        await self.supervisor.start_all()
        await self.admin.start()

    async def stop(self) -> None:
        await self.admin.stop()
        await self.supervisor.stop_all()
        await self.relay.close()
        self.prompts.close()

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
        authorization = request.headers.get("Authorization")
        # Refusals count under the key's tenant, also those refused before the key is
        # granted anything (a priority the key does not allow); no valid key counts as "".
        tenant = self.tenants.tenant_of(authorization)
        headers: dict[str, str] = {}
        try:
            hdrs = client_headers(request.headers)
            headers["X-Request-Id"] = hdrs.request_id
            identity = self.tenants.authenticate(authorization, hdrs.priority)
            routed = await self._route(request, hdrs, identity, kind, path)
            return await self.relay.handle(request, routed)
        except ApiError as err:
            self.metrics.rejections.labels(err.code, tenant or "").inc()
            if tenant is not None:
                headers.update(self.ledger.quota_headers(tenant))
            return error_response(err, headers)

    async def _route(
        self,
        request: web.Request,
        hdrs: ClientHeaders,
        identity: Identity,
        kind: Literal["chat", "completion"],
        path: str,
    ) -> Routed:
        body = await read_body(request)
        parsed = await self.prompts.parse(kind, body)
        if parsed.model != self.model_name:
            raise model_not_found(parsed.model, self.model_name)
        max_new = parsed.max_tokens or self.config.max_new_tokens_default
        limits = (
            ContextLimit(self.tenants.quotas[identity.tenant].max_context_tokens, "your tenant's"),
            ContextLimit(self.config.profile.max_context, f"model {self.model_name}'s"),
        )
        tokens = await self.prompts.tokens(parsed, max_new, limits)
        total = len(tokens) + max_new
        key = scoped_key(identity.tenant, hdrs.request_id)
        if self.ledger.holds(key):
            raise ApiError(
                400,
                "invalid_request",
                f"request id '{hdrs.request_id}' is already in flight; send a unique X-Request-Id",
            )
        self.ledger.check(identity.tenant, identity.priority, total)
        n = min(hdrs.prefix_tokens or 0, len(tokens))
        return Routed(
            request_id=hdrs.request_id,
            key=key,
            identity=identity,
            path=path,
            body=body,
            stream=parsed.stream,
            tokens=total,
            prefix=prefix_key(identity.tenant, hdrs.prefix_public, tokens[:n]) if n else None,
            headers={h: request.headers[h] for h in FORWARDED_HEADERS if h in request.headers},
        )

    # -- observability --------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        states = {r.id: r.state for r in self.supervisor.replicas.values()}
        ok = any(s == "running" for s in states.values())
        return json_response(
            {"status": "ok" if ok else "degraded", "replicas": states}, status=200 if ok else 503
        )

    async def info_endpoint(self, request: web.Request) -> web.Response:
        self.tenants.require_any_key(request.headers.get("Authorization"))
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
        self.tenants.require_admin(request.headers.get("Authorization"), "/metrics")
        return await self.open_metrics(request)

    async def open_metrics(self, request: web.Request) -> web.Response:
        """/metrics without a key: served only on the --metrics-port bind (loopback)."""
        self.metrics.ledger_reserved.clear()
        for tenant in self.tenants.quotas:
            self.metrics.ledger_reserved.labels(tenant).set(self.ledger.tenant_tokens(tenant))
        for rep in self.supervisor.replicas.values():
            self.metrics.replica_up.labels(rep.id).set(1 if rep.state == "running" else 0)
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def events(self, request: web.Request) -> web.Response:
        """Admin: every row. A tenant key: only that tenant's request rows (the cursor is the
        same; the other rows are skipped, not shown)."""
        authorization = request.headers.get("Authorization")
        tenant = None if self.tenants.is_admin(authorization) else self._tenant(authorization)
        body, cursor = read_events(self.state_dir, request.query.get("after", ""), tenant)
        return web.Response(
            body=body, content_type="application/x-ndjson", headers={"X-Next-Cursor": cursor}
        )

    def _tenant(self, authorization: str | None) -> str:
        tenant = self.tenants.tenant_of(authorization)
        if tenant is None:
            self.tenants.require_admin(authorization, "/debug/events")
        assert tenant is not None
        return tenant


def build_metrics_app(gw: Gateway) -> web.Application:
    """The keyless /metrics bind for a Prometheus scraper (`--metrics-port`)."""
    app = web.Application(middlewares=[api_errors])
    app.router.add_get("/metrics", gw.open_metrics)
    return app


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
