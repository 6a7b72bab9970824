"""The open-loop sender (workloads/openloop.py): every request goes out at its own time on
a greenlet of its own, whatever the answers before it; a stop counts what was not sent and
ends what still runs."""

from __future__ import annotations

import time

import gevent
import pytest

from workloads.openloop import OpenLoop, ReplayStart

pytestmark = pytest.mark.timeout(60)


def test_a_slow_answer_does_not_hold_back_the_next_send() -> None:
    started: list[tuple[int, float, float]] = []
    running: set[int] = set()
    overlapped: list[int] = []

    def send(item: int, due: float, prepared: str) -> None:
        assert prepared == f"prompt {item}"
        started.append((item, due, time.time()))
        if running:
            overlapped.append(item)
        running.add(item)
        gevent.sleep(1.0 if item == 0 else 0.0)  # the first answer is slow
        running.discard(item)

    t0 = time.time() + 0.05
    loop = OpenLoop([0, 1, 2], t0, lambda i: 0.02 * i, lambda i: f"prompt {i}", send)
    loop.run(stopping=lambda: False)
    loop.drain(stopping=lambda: False)
    assert [item for item, _, _ in started] == [0, 1, 2]
    assert [due for _, due, _ in started] == [t0, t0 + 0.02, t0 + 0.04]
    assert all(at >= due for _, due, at in started)  # never early
    assert overlapped == [1, 2] and loop.sent == 3 and loop.unsent == 0


def test_a_stop_counts_the_unsent_and_ends_the_stragglers() -> None:
    ended: list[int] = []

    def send(item: int, due: float, prepared: None) -> None:
        try:
            gevent.sleep(30)
        finally:
            ended.append(item)

    stop = False
    t0 = time.time()
    loop = OpenLoop([0, 1, 2, 3], t0, lambda i: 0.0 if i < 2 else 60.0, lambda i: None, send)
    runner = gevent.spawn(loop.run, lambda: stop)
    gevent.sleep(0.2)
    stop = True
    runner.join(timeout=10)
    loop.stop()
    assert (loop.sent, loop.unsent, loop.stragglers) == (2, 2, 2)
    assert sorted(ended) == [0, 1]  # each straggler's ending ran


def test_shares_split_a_schedule_without_loss_or_overlap() -> None:
    items = list(range(10))
    shares = [ReplayStart(0.0, i, 3).mine(items) for i in range(3)]
    assert sorted(x for share in shares for x in share) == items
