"""aiohttp helpers the gateway and the replica share: bounded body reads, error answers, and
an app runner that cancels handlers when their client disconnects (that is how a closed
connection becomes a cancel)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from server.protocol import MAX_BODY_BYTES, ApiError, body_too_large

JSON = "application/json"


async def read_body(request: web.Request) -> bytes:
    """The whole body, or ApiError(413) as soon as it passes MAX_BODY_BYTES."""
    declared = request.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        raise body_too_large(declared)
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise body_too_large(size)
        parts.append(chunk)
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


def write_json_atomic(path: Path, obj: Any) -> None:
    """Readers never see a half-written file: write a sibling, then rename over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.replace(path)


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve `app`; returns the runner and the bound port (for --port 0)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, int(runner.addresses[0][1])
