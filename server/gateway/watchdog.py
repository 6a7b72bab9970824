"""Bounding a relayed request whatever happens to its replica.

A replica that dies closes its sockets, which the relay sees at once. One that is alive but
stopped (SIGSTOP, a wedged loop) keeps the connection open and silent, and a request on it
would wait for ever. The watchdog ends such a request: when the upstream has been silent
for `interval` seconds it asks the replica's /health; no answer within PROBE_TIMEOUT_S
expires the relay's current timeout scope, so the relay answers 503 `replica_failed` (before
headers) or ends the stream with the SSE error event. A replica that answers is only slow (a
long prefill backlog, a long non-streaming answer) and the request keeps waiting.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

PROBE_TIMEOUT_S = 3.0  # a replica answers /health between two steps, in milliseconds
PROBE_REUSE_S = 1.0  # a health answer this recent stands for every request on that replica


class HealthProbe:
    """GET /health with a short timeout, shared by every request's watchdog so a thousand
    quiet requests on one replica cost about one probe a second, not a thousand."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        self._ok_at: dict[str, float] = {}  # health URL -> loop time of its last answer

    async def alive(self, url: str) -> bool:
        loop = asyncio.get_running_loop()
        if loop.time() - self._ok_at.get(url, -PROBE_REUSE_S) < PROBE_REUSE_S:
            return True
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._session.get(url, timeout=timeout) as resp:
                if resp.status == 200:
                    self._ok_at[url] = loop.time()
                    return True
        return False


class Watchdog:
    """One request's silence watch. Invariant: `target` is the timeout scope the relay is
    awaiting the replica in, or None; `touch()` is called for every upstream byte batch."""

    def __init__(self, probe: HealthProbe, health_url: str, interval: float) -> None:
        self._probe = probe
        self._health_url = health_url
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self.last = self._loop.time()
        self.target: asyncio.Timeout | None = None
        self.fired = False
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> Watchdog:
        self._task = self._loop.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    def touch(self) -> None:
        self.last = self._loop.time()

    async def _run(self) -> None:
        # Half-interval wakes: a silent, unresponsive replica is cut off within about
        # 1.5 x interval + PROBE_REUSE_S + PROBE_TIMEOUT_S of its last sign of life.
        while True:
            await asyncio.sleep(self._interval / 2)
            if self._loop.time() - self.last < self._interval:
                continue
            if await self._probe.alive(self._health_url):
                self.touch()  # slow, not stuck: look again after another quiet interval
                continue
            self.fired = True
            if self.target is not None:
                self.target.reschedule(self._loop.time())
            return
