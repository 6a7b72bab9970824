"""Waiting in tests: poll a condition until it holds or a generous deadline passes.

Tests wait on what they need (a file, a count, a state), never a fixed sleep: a busy machine
only makes the wait longer, and a wait that runs out names what it waited for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.02


def wait_until(
    predicate: Callable[[], T | None],
    timeout_s: float = 10.0,
    what: str = "the condition",
    sleep: Callable[[float], object] | None = None,
) -> T:
    """Polls `predicate` every POLL_S until it returns a truthy value, which is returned
    (so never None: a predicate may answer None for "not yet"); fails the test naming
    `what` after `timeout_s`. `sleep` defaults to `time.sleep`, looked
    up at each call: under Locust's monkey-patching it yields to gevent, so greenlets and
    servers in the test run meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}; it did not happen")
        (sleep or time.sleep)(POLL_S)


async def wait_until_async(
    predicate: Callable[[], T | None], timeout_s: float = 10.0, what: str = "the condition"
) -> T:
    """`wait_until` for a coroutine: polls between asyncio sleeps, so the loop runs on."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}; it did not happen")
        await asyncio.sleep(POLL_S)
