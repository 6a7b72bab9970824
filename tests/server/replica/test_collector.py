"""The step loop's garbage collection: which generation each pass takes, and that the loop
runs one after its steps and idle ticks (and nowhere else once automatic collection is off)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.replica import collector as collector_mod
from server.replica.collector import MIDDLE_EVERY, StepCollector
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
    monkeypatch.setattr(collector_mod.gc, "get_count", fake.get_count)
    monkeypatch.setattr(collector_mod.gc, "collect", fake.collect)
    return fake


def test_no_pass_until_enough_young_objects(fake_gc: FakeGc) -> None:
    c = StepCollector(young_objects=100, full_period_s=1e9)
    fake_gc.young = 99
    c.after_step()
    assert fake_gc.passes == []
    fake_gc.young = 100
    c.after_step()
    assert fake_gc.passes == [0]


def test_every_tenth_pass_takes_the_middle_generation(fake_gc: FakeGc) -> None:
    c = StepCollector(young_objects=1, full_period_s=1e9)
    for _ in range(2 * MIDDLE_EVERY):
        fake_gc.young = 5
        c.after_step()
    expected = ([0] * (MIDDLE_EVERY - 1) + [1]) * 2
    assert fake_gc.passes == expected


def test_a_full_pass_once_its_period_has_passed(fake_gc: FakeGc) -> None:
    now = [0.0]
    c = StepCollector(young_objects=1, full_period_s=10.0, clock=lambda: now[0])
    for t in (1.0, 9.9, 10.0, 15.0, 20.0):
        now[0] = t
        fake_gc.young = 5
        c.after_step()
    assert fake_gc.passes == [0, 0, 2, 0, 2]


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
        self.calls = 0

    def after_step(self) -> None:
        self.calls += 1


@pytest.fixture
def restore_gc() -> Iterator[None]:
    yield
    assert gc.isenabled(), "the step loop must never change the process's collector itself"


def test_the_loop_collects_after_every_step_and_idle_tick(tmp_path: Path, restore_gc: None) -> None:
    async def go() -> tuple[int, int]:
        rt = _runtime(tmp_path)
        counting = CountingCollector()
        rt.loop.collector = counting
        rt.loop.start()
        streams = [_submit(rt, f"c{i}", 6) for i in range(3)]
        await asyncio.wait_for(asyncio.gather(*(s.wait_done() for s, _ in streams)), 10)
        steps = rt.loop.stats.steps
        calls_when_done = counting.calls
        # Idle now: the loop still looks at the queue every tick, and collects after each.
        await asyncio.sleep(0.3)
        await rt.loop.stop()
        assert counting.calls > calls_when_done
        return steps, calls_when_done

    steps, calls = asyncio.run(go())
    assert steps > 0 and calls >= steps
