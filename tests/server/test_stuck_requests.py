"""Requests that ended only at the client's 30 s timeout in CI runs: a short interactive
prompt admitted behind several 32K prompts of its class waited ~25 s for its first token
(prefill ran in arrival order), and a stream whose replica never answers had no bound at all
at the gateway. Both are reproduced here through the gateway with one replica."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.server.procs import TEST_TENANTS, Proc, key, start_deployment

pytestmark = pytest.mark.e2e
LONG_PROMPT = 24_000  # tokens; at --time-scale 0.4 one prefill takes about a second
LONG_TENANTS = ("acme", "globex", "initech", "sys")
QUEUE_DEADLINE_S = 1.0
# The gateway ends a request on a stopped replica in ~15 s (queue deadline plus slack, then
# a failed health probe). A request it never ends lasts until this client timeout, which
# raises in the test: the bound is the client's, ten times what the gateway takes.
CLIENT_GIVES_UP_S = 180.0


def _deploy(tmp_path: Path, **config: int) -> Proc:
    cfg = tmp_path / "scheduler.yaml"
    cfg.write_text("".join(f"{k}: {v}\n" for k, v in config.items()))
    args = ["--config", str(cfg), "--tenants", str(TEST_TENANTS), "--time-scale", "0.4"]
    return start_deployment(tmp_path, *args, replicas=1)


async def _first_token(
    session: aiohttp.ClientSession,
    url: str,
    tenant: str,
    prompt: list[int],
    admitted: asyncio.Event,
) -> float:
    """Stream a completion; set `admitted` when headers arrive; the first content's time."""
    body = {"model": "llama-3-8b", "prompt": prompt, "max_tokens": 4, "stream": True}
    headers = {**key(tenant), "X-Priority": "interactive"}
    async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        admitted.set()
        async for line in resp.content:
            if line.startswith(b"data: {"):
                return time.monotonic()
    raise AssertionError(f"{tenant}: the stream ended without a token")


async def _long_then_short(url: str) -> tuple[list[float], float]:
    timeout = aiohttp.ClientTimeout(total=CLIENT_GIVES_UP_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        longs = []
        for i, tenant in enumerate(LONG_TENANTS):
            admitted = asyncio.Event()
            prompt = [10 + (i * 7 + j) % 4000 for j in range(LONG_PROMPT)]
            longs.append(asyncio.create_task(_first_token(session, url, tenant, prompt, admitted)))
            await asyncio.wait_for(admitted.wait(), 60)
        short = await _first_token(session, url, "acme", [11, 12, 13, 14], asyncio.Event())
        return list(await asyncio.gather(*longs)), short


def test_short_prompt_is_not_queued_behind_long_prefills(tmp_path: Path) -> None:
    proc = _deploy(tmp_path, step_token_budget=2048)
    try:
        longs, short = asyncio.run(_long_then_short(proc.url))
    finally:
        proc.stop()
    # In arrival order the short prompt's first token came after all four long prefills.
    assert short < sorted(longs)[1], (longs, short)


async def _send(
    session: aiohttp.ClientSession, url: str, stream: bool, started: asyncio.Event | None = None
) -> tuple[int, str, float]:
    """POST a completion; (status, body text, seconds from `started`, or from the send)."""
    body = {"model": "llama-3-8b", "prompt": "hello", "max_tokens": 3000, "stream": stream}
    body["ignore_eos"] = True
    t0 = time.monotonic()
    async with session.post(url + "/v1/completions", json=body, headers=key("acme")) as r:
        if started is None:
            return r.status, await r.text(), time.monotonic() - t0
        first = await r.content.readline()  # headers and the first token: it is running
        started.set()
        t0 = time.monotonic()
        return r.status, (first + await r.content.read()).decode(), time.monotonic() - t0


async def _while_replica_stopped(url: str, replica_pid: int) -> list[tuple[int, str, float]]:
    timeout = aiohttp.ClientTimeout(total=CLIENT_GIVES_UP_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        started = asyncio.Event()
        running = asyncio.create_task(_send(session, url, True, started))
        await asyncio.wait_for(started.wait(), 60)
        os.kill(replica_pid, signal.SIGSTOP)  # alive, connected, never answering
        return list(
            await asyncio.gather(running, _send(session, url, True), _send(session, url, False))
        )


@pytest.mark.timeout(CLIENT_GIVES_UP_S + 120)
def test_requests_on_a_stopped_replica_end_in_bounded_time(tmp_path: Path) -> None:
    proc = _deploy(tmp_path, queue_deadline_ms=int(QUEUE_DEADLINE_S * 1000))
    try:
        replica_pid = int(proc.ready["replicas"][0]["pid"])
        try:
            running, queued, whole = asyncio.run(_while_replica_stopped(proc.url, replica_pid))
        finally:
            os.kill(replica_pid, signal.SIGCONT)
    finally:
        proc.stop()
    # A started stream ends with the SSE error event, then [DONE].
    assert running[0] == 200 and '"code": "replica_failed"' in running[1], running
    assert running[1].rstrip().endswith("data: [DONE]"), running
    # A stream that got no headers by the queue deadline plus slack, and a non-streaming
    # request whose replica stopped answering its health check: 503 replica_failed, from
    # the gateway (before CLIENT_GIVES_UP_S) and not before the queue deadline.
    for status, text, took in (queued, whole):
        assert status == 503 and "replica_failed" in text, (status, text)
        assert took >= QUEUE_DEADLINE_S, took
