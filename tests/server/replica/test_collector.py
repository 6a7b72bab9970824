"""The step loop's garbage collection: when a young and a full pass run, and that the loop
offers the collector the room of each step and idle tick (and nothing else collects)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.replica.collector import (
    FIT_MARGIN,
    FULL_OVERDUE_S,
    FULL_PERIOD_S,
    YOUNG_OBJECTS,
    StepCollector,
)
from server.replica.loop import IDLE_TICK_S
from tests.server.replica.test_loop import _runtime, _submit


class FakeGc:
    """Stands in for the collector's view of `gc`: a young count the test sets, and the
    generations of the passes it was asked for."""

    def __init__(self) -> None:
        self.young = 0
        self.passes: list[int] = []

    def get_count(self) -> tuple[int, int, int]:
        return (self.young, 0, 0)

    def collect(self, generation: int = 2) -> int:
        self.passes.append(generation)
        self.young = 0
        return 0


@pytest.fixture
def fake_gc(monkeypatch: pytest.MonkeyPatch) -> FakeGc:
    fake = FakeGc()
    # The collector module's `gc` is the process's: patched for this test only.
    monkeypatch.setattr(gc, "get_count", fake.get_count)
    monkeypatch.setattr(gc, "collect", fake.collect)
    return fake


def test_a_young_pass_once_enough_young_objects_piled_up(fake_gc: FakeGc) -> None:
    c = StepCollector()
    fake_gc.young = YOUNG_OBJECTS - 1
    c.collect_in(1.0)
    assert fake_gc.passes == []
    fake_gc.young = YOUNG_OBJECTS
    c.collect_in(0.0)  # a young pass is short: it needs no room
    assert fake_gc.passes == [0]


def test_a_due_full_pass_waits_for_room_that_fits_it(fake_gc: FakeGc) -> None:
    now = [0.0]
    c = StepCollector(full_pass_s=0.020, clock=lambda: now[0])
    now[0] = FULL_PERIOD_S - 0.1
    c.collect_in(10.0)  # room, but not due
    now[0] = FULL_PERIOD_S
    c.collect_in(0.040)  # due, but the room is only twice the pass: a busy machine stretches it
    assert fake_gc.passes == []
    c.collect_in(FIT_MARGIN * 0.020)  # a long step: room enough
    assert fake_gc.passes == [2]


def test_an_overdue_full_pass_runs_in_whatever_room_there_is(fake_gc: FakeGc) -> None:
    now = [0.0]
    c = StepCollector(full_pass_s=0.020, clock=lambda: now[0])
    for t in (FULL_PERIOD_S, FULL_OVERDUE_S / 2, FULL_OVERDUE_S - 1):
        now[0] = t
        c.collect_in(0.001)
    assert fake_gc.passes == []
    now[0] = FULL_OVERDUE_S
    c.collect_in(-0.005)  # even with the next step already late
    assert fake_gc.passes == [2]
    now[0] = FULL_OVERDUE_S + FULL_PERIOD_S / 2
    c.collect_in(10.0)  # the period starts again from that pass
    assert fake_gc.passes == [2]


def test_take_over_freezes_start_up_and_turns_automatic_collection_off() -> None:
    assert gc.isenabled()
    try:
        StepCollector.take_over()
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()


class CountingCollector(StepCollector):
    def __init__(self) -> None:
        super().__init__()
        self.rooms: list[float] = []

    def collect_in(self, room_s: float) -> None:
        self.rooms.append(room_s)


@pytest.fixture
def restore_gc() -> Iterator[None]:
    yield
    assert gc.isenabled(), "the step loop must never change the process's collector itself"


def test_the_loop_offers_each_step_and_idle_tick_to_the_collector(
    tmp_path: Path, restore_gc: None
) -> None:
    async def go() -> tuple[int, int]:
        rt = _runtime(tmp_path)
        counting = CountingCollector()
        rt.loop.collector = counting
        rt.loop.start()
        streams = [_submit(rt, f"c{i}", 6) for i in range(3)]
        await asyncio.wait_for(asyncio.gather(*(s.wait_done() for s, _ in streams)), 10)
        steps = rt.loop.stats.steps
        offered_when_done = len(counting.rooms)
        # Idle now: the loop still looks at the queue every tick, and offers the tick.
        await asyncio.sleep(0.3)
        await rt.loop.stop()
        assert IDLE_TICK_S in counting.rooms[offered_when_done:]
        # Each step offers what is left of its simulated time: never more than the step.
        busy = [r for r in counting.rooms[:offered_when_done] if r != IDLE_TICK_S]
        assert len(busy) >= steps and max(busy) < 1.0
        return steps, len(busy)

    steps, offered = asyncio.run(go())
    assert steps > 0 and offered >= steps
