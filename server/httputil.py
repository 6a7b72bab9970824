"""aiohttp helpers the gateway and the replica share: bounded body reads, error answers, and
the HTTP server they run on: it cancels handlers when their client disconnects (that is how a
closed connection becomes a cancel), answers parser-level errors with OpenAI JSON, never
inflates compressed bodies, closes idle and slow connections, and caps connections per client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import HttpProcessingError

from server.protocol import MAX_BODY_BYTES, ApiError, body_too_large, error_body

JSON = "application/json"
log = logging.getLogger("kvgate.server")


IDLE_TIMEOUT_S = 60.0
BODY_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Connection-level limits of one listening site.

    `idle_timeout_s` is aiohttp's keep-alive timeout, which also runs from the moment a
    connection opens: a connection that has not sent a complete request head by then
    (idle, or a slowloris trickling header bytes) is closed. `body_timeout_s` bounds reading
    a request body. `max_client_connections` (0 = no cap) bounds open connections per
    client address.
    """

    idle_timeout_s: float = IDLE_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    max_client_connections: int = 0


BODY_TIMEOUT = web.AppKey("body_timeout_s", float)


async def read_body(request: web.Request) -> bytes:
    """The whole body, or ApiError(413) as soon as it passes MAX_BODY_BYTES, ApiError(408)
    when it takes longer than the site's body timeout, ApiError(400) when its framing is bad."""
    declared = request.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        raise body_too_large(declared)
    timeout_s = request.app.get(BODY_TIMEOUT, BODY_TIMEOUT_S)
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                chunk = await request.content.readany()
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise body_too_large(size)
                parts.append(chunk)
    except TimeoutError:
        raise ApiError(
            408,
            "request_timeout",
            f"the request body did not arrive within {timeout_s:g} s ({size} bytes read); send "
            f"the whole body at once",
        ) from None
    except HttpProcessingError as exc:
        raise ApiError(
            400, "invalid_request", f"the request body is malformed ({exc.message}); resend it"
        ) from None
    return b"".join(parts)


def json_response(
    obj: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=json.dumps(obj, separators=(",", ":")).encode(),
        status=status,
        content_type=JSON,
        headers=headers,
    )


def error_response(err: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    merged = {**(headers or {}), **err.headers}
    return web.Response(body=err.body(), status=err.status, content_type=JSON, headers=merged)


@web.middleware
async def api_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """ApiError anywhere becomes its JSON answer; unknown paths get a JSON 404."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except ApiError as err:
        return error_response(err)
    except web.HTTPNotFound:
        return error_response(
            ApiError(404, "not_found", f"no endpoint {request.method} {request.path}")
        )
    except web.HTTPMethodNotAllowed:
        return error_response(
            ApiError(
                405, "method_not_allowed", f"{request.method} is not allowed on {request.path}"
            )
        )
    except web.HTTPException as exc:
        status = exc.status if 400 <= exc.status < 600 else 400
        return error_response(ApiError(status, "invalid_request", exc.reason))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Readers never see a half-written file: write a sibling, then rename over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.replace(path)


class _JsonErrorHandler(web_protocol.RequestHandler):
    """aiohttp's connection protocol, with errors raised before any handler runs (a bad
    request line, oversized headers, broken chunking) answered as OpenAI error JSON instead
    of text/plain."""

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            log.error("error handling a request", exc_info=exc)
            code, text = "internal_error", "the server failed on this request; retry"
        else:
            reason = message or (exc.__class__.__name__ if exc else "bad request")
            code = "request_timeout" if status == 408 else "invalid_request"
            text = f"malformed HTTP request ({reason}); send a well-formed HTTP/1.1 request"
        type_ = "server_error" if status >= 500 else "invalid_request_error"
        resp = web.Response(body=error_body(text[:500], type_, code), status=status)
        resp.content_type = JSON
        resp.force_close()
        return resp


_TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)


class _LimitedServer(web.Server):
    """aiohttp's server (the protocol factory) with a cap on connections per client
    address: one more is answered 429 and closed before it is read. Invariant: `_by_peer`
    counts, per address, the connections `_peer_of` holds: those made and not yet lost."""

    max_client_connections = 0
    _by_peer: dict[str, int]
    _peer_of: dict[web_protocol.RequestHandler, str]

    def start_counting(self) -> None:
        # Counted as connections come and go, not by walking every open connection at each
        # new one: a burst of 500 connections from one client was 125,000 look-ups.
        self._by_peer, self._peer_of = {}, {}

    def __call__(self) -> web_protocol.RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)

    def connection_made(
        self, handler: web_protocol.RequestHandler, transport: asyncio.Transport
    ) -> None:
        super().connection_made(handler, transport)
        cap = self.max_client_connections
        if not cap:
            return
        peer = _peer_host(transport)
        self._peer_of[handler] = peer
        same = self._by_peer[peer] = self._by_peer.get(peer, 0) + 1
        if same > cap:
            body = error_body(
                f"client {peer} already has {cap} open connections, the limit; reuse them "
                f"or close some",
                "rate_limit_error",
                "too_many_connections",
            )
            transport.write(_TOO_MANY % (len(body), body))
            handler.force_close()

    def connection_lost(
        self, handler: web_protocol.RequestHandler, exc: BaseException | None = None
    ) -> None:
        super().connection_lost(handler, exc)
        peer = self._peer_of.pop(handler, None)
        if peer is None:
            return
        left = self._by_peer[peer] - 1
        if left:
            self._by_peer[peer] = left
        else:
            del self._by_peer[peer]


def _peer_host(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


class _HardenedRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # Same arguments, our protocol factory: aiohttp builds its Server in one place only.
        server.__class__ = _LimitedServer
        assert isinstance(server, _LimitedServer)
        server.start_counting()
        return server


async def start_site(
    app: web.Application, host: str, port: int, limits: HttpLimits | None = None
) -> tuple[web.AppRunner, int]:
    """Serve `app` with `limits`; returns the runner and the bound port (for --port 0).
    Request bodies are never decompressed (see `headers.refuse_content_encoding`)."""
    limits = limits or HttpLimits()
    app[BODY_TIMEOUT] = limits.body_timeout_s
    runner = _HardenedRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        auto_decompress=False,
        keepalive_timeout=limits.idle_timeout_s,
    )
    await runner.setup()
    assert isinstance(runner.server, _LimitedServer)
    runner.server.max_client_connections = limits.max_client_connections
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, int(runner.addresses[0][1])
