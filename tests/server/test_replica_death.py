"""SIGKILL a replica while 50 streams (and 10 batch requests) run: the gateway drops its
reservations, replays the replayable requests elsewhere exactly once, ends started streams
with an error event, and no request ever holds blocks on two replicas."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import defaultdict
from pathlib import Path

import aiohttp
import pytest
import requests

from tests.server.procs import Proc, events, key, start_deployment

pytestmark = pytest.mark.e2e
ADMIN = key("admin")
STREAM_TENANTS = ("acme", "globex", "initech", "sys")


async def _stream(session: aiohttp.ClientSession, url: str, i: int) -> dict:
    body = {
        "model": "llama-3-8b",
        "messages": [{"role": "user", "content": f"stream {i}"}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {**key(STREAM_TENANTS[i % 4]), "X-Request-Id": f"s{i}"}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        text = (await resp.read()).decode()
    return {
        "id": f"s{i}",
        "status": resp.status,
        "replica": resp.headers.get("X-Kvgate-Replica"),
        "retry_after": resp.headers.get("Retry-After"),
        "text": text,
    }


async def _batch(session: aiohttp.ClientSession, url: str, i: int) -> dict:
    body = {
        "model": "llama-3-8b",
        "prompt": f"batch job {i}",
        "max_tokens": 300,
        "ignore_eos": True,
    }
    headers = {**key("batch"), "X-Request-Id": f"b{i}"}
    async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
        data = await resp.json()
    return {
        "id": f"b{i}",
        "status": resp.status,
        "replica": resp.headers.get("X-Kvgate-Replica"),
        "body": data,
    }


async def _ledger_settles(url: str, dead: str, t_kill: float) -> float:
    """Seconds from the kill until the ledger holds nothing on `dead` and has zero drift."""
    async with aiohttp.ClientSession(headers=ADMIN) as s:
        while time.time() - t_kill < 5:
            async with s.get(url + "/admin/ledger") as resp:
                rep = await resp.json()
            if (
                rep["replicas"][dead] == "dead"
                and dead not in rep["by_replica"]
                and (rep["drift_tokens"] == 0)
            ):
                return time.time() - t_kill
            await asyncio.sleep(0.05)
    raise AssertionError(f"ledger never settled after the kill: {rep}")


async def _all_placed(url: str, n: int) -> None:
    """Wait until the gateway holds all `n` requests and r0 has admitted a batch one."""
    async with aiohttp.ClientSession(headers=ADMIN) as s:
        for _ in range(200):
            async with s.get(url + "/admin/ledger") as resp:
                routed = (await resp.json())["requests"] == n
            async with s.get(url + "/debug/events") as resp:
                on_r0 = any(
                    e["replica"] == "r0" and e["event"] == "admitted" and e["request_id"][0] == "b"
                    for e in map(json.loads, (await resp.text()).splitlines())
                    if e["request_id"]
                )
            if routed and on_r0:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"the gateway never held all {n} requests with a batch one on r0")


async def _scenario(url: str, victim_pid: int) -> tuple[list[dict], float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [asyncio.ensure_future(_stream(session, url, i)) for i in range(50)]
        tasks += [asyncio.ensure_future(_batch(session, url, i)) for i in range(10)]
        await _all_placed(url, len(tasks))
        t_kill = time.time()
        os.kill(victim_pid, signal.SIGKILL)
        settle = await _ledger_settles(url, "r0", t_kill)
        results = await asyncio.gather(*tasks)
    return results, settle


def test_kill_replica_during_streams(tmp_path: Path) -> None:
    dep: Proc = start_deployment(tmp_path, "--time-scale", "1.0")
    try:
        reps = requests.get(dep.url + "/admin/replicas", headers=ADMIN, timeout=5).json()
        victim = next(r for r in reps if r["id"] == "r0")
        results, settle = asyncio.run(_scenario(dep.url, victim["pid"]))
        assert settle <= 2.0

        streams = [r for r in results if r["id"].startswith("s")]
        batches = [r for r in results if r["id"].startswith("b")]
        broken = [s for s in streams if '"replica_failed"' in s["text"]]
        assert broken, "no stream was on the killed replica"
        for s in broken:
            if s["status"] == 200:  # it had started: the SSE error event, then [DONE]
                assert s["replica"] == "r0" and s["text"].rstrip().endswith("data: [DONE]")
            else:  # still on its way to r0 and not replayable: a clean 503
                assert s["status"] == 503 and int(s["retry_after"]) >= 1
        for s in streams:
            if s not in broken:
                assert s["status"] == 200 and s["text"].count('"delta":{"content"') == 400
        for b in batches:  # replayable: all complete, on the survivor
            assert b["status"] == 200, b
            assert b["replica"] == "r1" and b["body"]["usage"]["completion_tokens"] == 300

        _assert_never_on_two_replicas(events(dep.url))
        metrics = requests.get(dep.url + "/metrics", headers=ADMIN, timeout=5).text
        assert 'kvgate_gateway_replica_up{replica="r0"} 0.0' in metrics
        assert "kvgate_gateway_retries_total 0.0" not in metrics

        restarted = requests.post(dep.url + "/admin/replicas/r0/restart", headers=ADMIN, timeout=60)
        assert restarted.status_code == 200, restarted.text
        info = restarted.json()
        assert info["state"] == "running" and info["pid"] != victim["pid"]
        assert info["port"] == victim["port"] and info["restarts"] == 1
    finally:
        dep.stop()


def _assert_never_on_two_replicas(rows: list[dict]) -> None:
    died = {r["replica"]: r["t"] for r in rows if r["event"] == "replica_died"}
    spans: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for r in rows:
        if r["request_id"]:
            span = spans[r["request_id"]].setdefault(r["replica"], [r["t"], r["t"]])
            span[0], span[1] = min(span[0], r["t"]), max(span[1], r["t"])
    moved = {rid: s for rid, s in spans.items() if len(s) > 1}
    assert moved, "no request was replayed"
    for rid, by_replica in moved.items():
        assert set(by_replica) == {"r0", "r1"}, (rid, by_replica)
        assert rid.startswith("b"), f"non-replayable {rid} ran twice"
        assert by_replica["r0"][1] <= died["r0"] <= by_replica["r1"][0], json.dumps(by_replica)
