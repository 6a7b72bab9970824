"""A long-context burst on one replica: `naive` (pool = all memory after weights) overruns
the virtual GPU and dies like a real replica; `seed` stays inside its pool and answers the
excess with explicit rejections."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import requests

from tests.server.procs import key, start_replica
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e
TENANTS = ("acme", "globex", "initech", "batch", "sys")
PER_TENANT = 4
PROMPT = [203, 300, 301, 302] * 7500  # 30,000 token ids of the default tokenizer


async def _one(session: aiohttp.ClientSession, url: str, tenant: str, i: int) -> tuple[int, str]:
    body = {"model": "llama-3-8b", "prompt": PROMPT, "max_tokens": 256, "ignore_eos": True}
    try:
        async with session.post(url + "/v1/completions", json=body, headers=key(tenant)) as resp:
            await resp.read()
            return resp.status, resp.headers.get("Retry-After", "")
    except aiohttp.ClientError as exc:
        return -1, type(exc).__name__


async def _burst(url: str) -> list[tuple[int, str]]:
    # A request takes seconds; the timeout is for a hung replica only.
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        return await asyncio.gather(
            *(_one(session, url, t, i) for t in TENANTS for i in range(PER_TENANT))
        )


def test_naive_dies_of_oom(tmp_path: Path) -> None:
    proc = start_replica(tmp_path, "--policy", "naive", "--time-scale", "0.02")
    try:
        results = asyncio.run(_burst(proc.url))
        wait_until(lambda: proc.popen.poll() is not None, timeout_s=30, what="the replica to die")
        assert proc.popen.returncode != 0
        assert "CUDA out of memory" in proc.output()
        assert any(status == -1 for status, _ in results), "its streams break"
    finally:
        proc.stop()


def test_seed_rejects_instead(tmp_path: Path) -> None:
    proc = start_replica(tmp_path, "--policy", "seed", "--time-scale", "0.02")
    try:
        results = asyncio.run(_burst(proc.url))
        assert proc.popen.poll() is None, proc.output()
        assert "out of memory" not in proc.output()
        rejected = [(s, ra) for s, ra in results if s in (429, 503)]
        assert rejected, results
        assert all(ra.isdigit() and int(ra) >= 1 for _, ra in rejected)
        assert all(s in (200, 429, 503) for s, _ in results), results
        assert any(s == 200 for s, _ in results)
        admin = {"Authorization": "Bearer kvg-admin-key"}
        gpu = requests.get(proc.url + "/debug/gpu", headers=admin, timeout=5).json()
        assert gpu["used_bytes"] <= gpu["total_bytes"]
    finally:
        proc.stop()
