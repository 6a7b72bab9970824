"""`kvgate bench server --release`: how fast the reference deployment lets go of what it
holds, on a fresh deployment.

Owns two scenarios, which the server tests replay to check what happens (every disconnect
released, for the right request; the ledger settled) while this module measures how long it
takes:
- **disconnect storm**: waves of clients close their stream right after its first token;
  the figure is each request's `released` event minus its client's close (p50, p99, max;
  the release line of the seed is 50 ms at P99 for one replica's own release path);
- **replica kill**: SIGKILL one replica while 50 streams and 10 replayable batch requests
  run; the figure is the kill to the gateway's ledger holding nothing on the dead replica,
  with zero drift (the failover gate allows 2 s).
It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import Request, urlopen

import aiohttp

from harness.bench.base import Bench, BenchError, BenchUsageError, stop_process
from harness.bench.hostile import start_deployment

ADMIN_KEY = "kvg-admin-key"
STREAM_TENANTS = ("acme", "globex", "initech", "sys")
TARGET_RELEASE_P99_MS = 50.0
TARGET_SETTLE_S = 2.0
RELEASE_WAIT_S = 30.0  # how long the storm waits for releases that have not come yet


def _admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def server_events(url: str) -> list[dict[str, Any]]:
    """Every event the deployment has logged, following the cursor to the end."""
    rows: list[dict[str, Any]] = []
    cursor = ""
    while True:
        query = f"?after={cursor}" if cursor else ""
        with urlopen(
            Request(f"{url}/debug/events{query}", headers=_admin_headers()), timeout=10
        ) as r:
            lines = [json.loads(line) for line in r.read().decode().splitlines() if line]
            cursor = r.headers.get("X-Next-Cursor", "")
        if not lines:
            return rows
        rows += lines


# -- the disconnect storm -------------------------------------------------------------------


async def _stream_then_disconnect(host: str, port: int, rid: str) -> float:
    """Open a stream, read until its first content chunk, close; returns the close time."""
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
        chunk = await asyncio.wait_for(reader.read(65536), 60)
        if not chunk:
            raise BenchError(f"{rid}: the stream ended before its first token: {seen[-300:]!r}")
        seen += chunk
    t_close = time.time()
    writer.transport.abort()
    return t_close


async def _storm(url: str, cancels: int, wave: int) -> dict[str, float]:
    u = urlparse(url)
    closed: dict[str, float] = {}
    for n in range(0, cancels, wave):
        ids = [f"c{n + i}" for i in range(min(wave, cancels - n))]
        times = await asyncio.gather(
            *(_stream_then_disconnect(u.hostname or "", u.port or 0, rid) for rid in ids)
        )
        closed.update(zip(ids, times, strict=True))
    return closed


def disconnect_storm(url: str, cancels: int = 200, wave: int = 20) -> dict[str, float]:
    """Request id -> the epoch second its client closed the stream (after its first token)."""
    return asyncio.run(_storm(url, cancels, wave))


def releases(
    url: str, closed: dict[str, float], wait_s: float = RELEASE_WAIT_S
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The `released` time of each closed request (those that came within `wait_s`), and the
    whole event log as it was last read."""
    deadline = time.monotonic() + wait_s
    while True:
        rows = server_events(url)
        released = {
            e["request_id"]: e["t"]
            for e in rows
            if e["event"] == "released" and e["request_id"] in closed
        }
        if len(released) == len(closed) or time.monotonic() > deadline:
            return released, rows
        time.sleep(0.1)


def _quantile(values: Sequence[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] if ordered else None


def measure_storm(url: str, cancels: int, wave: int) -> dict[str, Any]:
    closed = disconnect_storm(url, cancels, wave)
    released, _ = releases(url, closed)
    delays_ms = [1000 * (released[rid] - closed[rid]) for rid in released]
    p99 = _quantile(delays_ms, 0.99)
    return {
        "cancels": len(closed),
        "released": len(released),
        "release_ms_p50": _round(_quantile(delays_ms, 0.5)),
        "release_ms_p99": _round(p99),
        "release_ms_max": _round(max(delays_ms, default=None)),
        "meets_target": len(released) == len(closed)
        and p99 is not None
        and p99 <= TARGET_RELEASE_P99_MS,
    }


# -- the replica kill -----------------------------------------------------------------------


async def _stream(session: aiohttp.ClientSession, url: str, i: int) -> dict[str, Any]:
    body = {
        "model": "llama-3-8b",
        "messages": [{"role": "user", "content": f"stream {i}"}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    tenant = STREAM_TENANTS[i % len(STREAM_TENANTS)]
    headers = {"Authorization": f"Bearer kvg-{tenant}-key", "X-Request-Id": f"s{i}"}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        text = (await resp.read()).decode()
    return {
        "id": f"s{i}",
        "status": resp.status,
        "replica": resp.headers.get("X-Kvgate-Replica"),
        "retry_after": resp.headers.get("Retry-After"),
        "text": text,
    }


async def _batch(session: aiohttp.ClientSession, url: str, i: int) -> dict[str, Any]:
    body = {
        "model": "llama-3-8b",
        "prompt": f"batch job {i}",
        "max_tokens": 300,
        "ignore_eos": True,
    }
    headers = {"Authorization": "Bearer kvg-batch-key", "X-Request-Id": f"b{i}"}
    async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
        data = await resp.json()
    return {
        "id": f"b{i}",
        "status": resp.status,
        "replica": resp.headers.get("X-Kvgate-Replica"),
        "body": data,
    }


async def _all_placed(url: str, n: int, victim: str, wait_s: float) -> None:
    """Wait until the gateway holds all `n` requests and `victim` has admitted a batch one."""
    deadline = time.monotonic() + wait_s
    async with aiohttp.ClientSession(headers=_admin_headers()) as s:
        while time.monotonic() < deadline:
            async with s.get(url + "/admin/ledger") as resp:
                routed = (await resp.json())["requests"] == n
            async with s.get(url + "/debug/events") as resp:
                on_victim = any(
                    e["replica"] == victim
                    and e["event"] == "admitted"
                    and (e["request_id"] or "").startswith("b")
                    for e in map(json.loads, (await resp.text()).splitlines())
                )
            if routed and on_victim:
                return
            await asyncio.sleep(0.05)
    raise BenchError(f"the gateway never held all {n} requests with a batch one on {victim}")


async def _ledger_settles(url: str, dead: str, t_kill: float, wait_s: float) -> float:
    """Seconds from the kill until the ledger holds nothing on `dead` and has zero drift."""
    rep: dict[str, Any] = {}
    async with aiohttp.ClientSession(headers=_admin_headers()) as s:
        while time.time() - t_kill < wait_s:
            async with s.get(url + "/admin/ledger") as resp:
                rep = await resp.json()
            if (
                rep["replicas"][dead] == "dead"
                and dead not in rep["by_replica"]
                and rep["drift_tokens"] == 0
            ):
                return time.time() - t_kill
            await asyncio.sleep(0.05)
    raise BenchError(f"the ledger never settled within {wait_s:g} s of the kill: {rep}")


async def _kill_scenario(
    url: str, victim: str, victim_pid: int, wait_s: float
) -> tuple[list[dict[str, Any]], float]:
    timeout = aiohttp.ClientTimeout(total=wait_s + 60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks = [asyncio.ensure_future(_stream(session, url, i)) for i in range(50)]
        tasks += [asyncio.ensure_future(_batch(session, url, i)) for i in range(10)]
        await _all_placed(url, len(tasks), victim, wait_s)
        t_kill = time.time()
        os.kill(victim_pid, signal.SIGKILL)
        settle = await _ledger_settles(url, victim, t_kill, wait_s)
        results = await asyncio.gather(*tasks)
    return results, settle


def kill_during_streams(
    url: str, victim: str, victim_pid: int, wait_s: float = 30.0
) -> tuple[list[dict[str, Any]], float]:
    """Each request's answer (50 streams `s*`, 10 batch `b*`) and the seconds from the kill
    of `victim` until the gateway's ledger settled; waits at most `wait_s` for each."""
    return asyncio.run(_kill_scenario(url, victim, victim_pid, wait_s))


def measure_kill(url: str, replicas: list[dict[str, Any]]) -> dict[str, Any]:
    victim = next(r for r in replicas if r["id"] == "r0")
    results, settle = kill_during_streams(url, "r0", int(victim["pid"]))
    return {
        "ledger_settle_s": round(settle, 3),
        "requests": len(results),
        "status_200": sum(r["status"] == 200 for r in results),
        "meets_target": settle <= TARGET_SETTLE_S,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if not (1 <= args.wave <= args.cancels <= 5000):
        raise BenchUsageError("need 1 <= --wave <= --cancels <= 5000")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-release-") as tmp:
        proc, ready = start_deployment(Path(tmp) / "storm", replicas=1, time_scale=1.0)
        try:
            out["disconnect_storm"] = measure_storm(
                str(ready["gateway_url"]), args.cancels, args.wave
            )
        finally:
            stop_process(proc, grace_s=20)
        proc, ready = start_deployment(Path(tmp) / "kill", replicas=2, time_scale=1.0)
        try:
            out["replica_kill"] = measure_kill(str(ready["gateway_url"]), ready["replicas"])
        finally:
            stop_process(proc, grace_s=20)
    out["targets"] = {"release_ms_p99": TARGET_RELEASE_P99_MS, "ledger_settle_s": TARGET_SETTLE_S}
    out["meets_targets"] = all(
        part["meets_target"] for part in out.values() if "meets_target" in part
    )
    return out


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cancels", type=int, default=200, help="streams closed in the storm")
    parser.add_argument("--wave", type=int, default=20, help="streams opened at once")


BENCH = Bench("kvgate bench server --release", __doc__ or "", _options, measure)
