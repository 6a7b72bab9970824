"""Paces new requests into the room the step loop leaves, so a burst of arrivals cannot hold
the virtual GPU's next step back.

A new request costs the replica's event loop a few hundred microseconds before it reaches the
scheduler (its body, parsing, the context check, the stream's set-up, the response head).
When dozens arrive at once (a peak begins, a restarted replica is refilled, retries land)
the event loop ran them all in one go: 40 to 85 of them took 22 to 49 ms and the step that
fell due meanwhile ran that late. Here a request starts only while the step in flight leaves
room before it is due; the others wait, in arrival order, for the room of a later step. A few
start per step whatever the room, so a loop that runs behind still admits.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

# A request starts only while at least this long is left before the next step is due: more
# than the loop's share of one request (about 0.1 ms for a short prompt, 1 ms for a 32K-token
# one), so starting one never makes the step late.
ROOM_S = 0.002
# Requests that start in each step's room whatever is left of it: progress when the steps
# run back to back (a long prefill, a loop behind its clock), at a bounded cost per step.
EVERY_STEP = 4


class AdmissionPacer:
    """Owns the requests waiting for their turn. Invariant: they start in arrival order, at
    most one of them is woken and not yet run at any time, and a request waits only while a
    step is in flight and the room before it is due is used up (or was, for the ones before
    it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._woken: asyncio.Future[None] | None = None
        self._due: float | None = None  # when the step in flight is due; None: none is
        self._started = 0  # requests started in this step's room

    @property
    def waiting(self) -> int:
        return len(self._waiting) + (self._woken is not None)

    def open(self, due: float | None) -> None:
        """The step loop starts waiting for a step due at `due` (monotonic), or goes idle
        (None): the room for new requests is what is left until then."""
        self._due = due
        self._started = 0
        self._wake_next()

    async def turn(self) -> None:
        """Returns when the calling request may start its work."""
        if not self._waiting and self._woken is None and self._may_start():
            self._started += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        while True:
            try:
                await fut
            except asyncio.CancelledError:
                self._forget(fut)
                raise
            self._woken = None
            if self._may_start():
                self._started += 1
                self._wake_next()  # runs after this request's work, when the loop is free
                return
            fut = asyncio.get_running_loop().create_future()
            self._waiting.appendleft(fut)  # still first in line for the next step's room

    def _may_start(self) -> bool:
        due = self._due
        return due is None or self._started < EVERY_STEP or due - self._clock() > ROOM_S

    def _wake_next(self) -> None:
        if self._woken is not None:
            return
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                self._woken = fut
                fut.set_result(None)
                return

    def _forget(self, fut: asyncio.Future[None]) -> None:
        """A waiting request went away (its client left): it gives up its place."""
        if self._woken is fut:
            self._woken = None
            self._wake_next()
        elif fut in self._waiting:
            self._waiting.remove(fut)
