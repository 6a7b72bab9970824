"""Closing the connection cancels the request: 200 clients disconnect mid-stream through the
gateway, and each request's `released` event follows its disconnect within 50 ms (P99)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.server.procs import TEST_TENANTS, events, start_deployment

pytestmark = pytest.mark.e2e
CANCELS = 200
WAVE = 20


async def _stream_then_disconnect(host: str, port: int, rid: str) -> float:
    """Open a stream, read until the first content chunk, close; returns the close time."""
    body = json.dumps(
        {
            "model": "llama-3-8b",
            "messages": [{"role": "user", "content": "cancel me"}],
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer kvg-acme-key\r\nX-Request-Id: {rid}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head + body)
    seen = b""
    while b'"delta":{"content"' not in seen:
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, f"{rid}: stream ended before its first token: {seen[-300:]!r}"
        seen += chunk
    t_close = time.time()
    writer.transport.abort()
    return t_close


async def _storm(url: str) -> dict[str, float]:
    u = urlparse(url)
    closed: dict[str, float] = {}
    for wave in range(CANCELS // WAVE):
        ids = [f"c{wave}-{i}" for i in range(WAVE)]
        times = await asyncio.gather(
            *(_stream_then_disconnect(u.hostname or "", u.port or 0, rid) for rid in ids)
        )
        closed.update(zip(ids, times, strict=True))
    return closed


def test_disconnect_releases_within_50ms_p99(tmp_path: Path) -> None:
    dep = start_deployment(
        tmp_path, "--time-scale", "1.0", "--tenants", str(TEST_TENANTS), replicas=1
    )
    try:
        closed = asyncio.run(_storm(dep.url))
        deadline = time.monotonic() + 5
        released: dict[str, float] = {}
        while time.monotonic() < deadline and len(released) < CANCELS:
            released = {
                e["request_id"]: e["t"]
                for e in events(dep.url)
                if e["event"] == "released" and e["request_id"] in closed
            }
            time.sleep(0.1)
        assert len(released) == CANCELS
        cancelled = {e["request_id"] for e in events(dep.url) if e["event"] == "cancelled"}
        assert cancelled >= set(closed), "every disconnect is recorded as a cancel"
        delays = sorted(released[rid] - closed[rid] for rid in closed)
        p99 = delays[int(0.99 * (len(delays) - 1))]
        assert p99 <= 0.050, f"P99 disconnect-to-release {p99 * 1000:.1f} ms"
    finally:
        dep.stop()
