"""New requests start in the room the step loop leaves: at once while there is room or the
loop is idle, otherwise in arrival order as later steps open, a few per step whatever the
room; a request that goes away while waiting gives up its place."""

from __future__ import annotations

import asyncio
from pathlib import Path

from server.replica.pacer import EVERY_STEP, ROOM_S, AdmissionPacer
from tests.server.replica.test_loop import _runtime, _submit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _settle() -> None:
    """Lets every woken request run (each wakes the next when it starts)."""
    for _ in range(50):
        await asyncio.sleep(0)


def _requests(pacer: AdmissionPacer, n: int, started: list[int]) -> list[asyncio.Task[None]]:
    async def request(i: int) -> None:
        await pacer.turn()
        started.append(i)

    return [asyncio.create_task(request(i)) for i in range(n)]


def test_requests_start_at_once_while_idle_or_with_room() -> None:
    async def go() -> None:
        clock = Clock()
        pacer = AdmissionPacer(clock)
        started: list[int] = []
        _requests(pacer, 3 * EVERY_STEP, started)  # no step in flight yet
        await _settle()
        assert started == list(range(3 * EVERY_STEP))
        pacer.open(clock.now + 10 * ROOM_S)
        started.clear()
        _requests(pacer, 3 * EVERY_STEP, started)
        await _settle()
        assert started == list(range(3 * EVERY_STEP)) and pacer.waiting == 0

    asyncio.run(go())


def test_without_room_a_few_start_per_step_in_arrival_order() -> None:
    async def go() -> None:
        clock = Clock()
        pacer = AdmissionPacer(clock)
        pacer.open(clock.now + ROOM_S / 2)  # the step in flight leaves too little room
        started: list[int] = []
        n = 3 * EVERY_STEP + 1
        _requests(pacer, n, started)
        await _settle()
        assert started == list(range(EVERY_STEP))
        pacer.open(clock.now)  # the next step is already due: still a few start
        await _settle()
        assert started == list(range(2 * EVERY_STEP))
        assert pacer.waiting == n - 2 * EVERY_STEP
        pacer.open(clock.now + 1.0)  # a long step: room for everyone left, in order
        await _settle()
        assert started == list(range(n)) and pacer.waiting == 0

    asyncio.run(go())


def test_room_used_up_while_starting_holds_the_rest_back() -> None:
    async def go() -> None:
        clock = Clock()
        pacer = AdmissionPacer(clock)
        pacer.open(clock.now)
        started: list[int] = []

        async def request(i: int) -> None:
            await pacer.turn()
            started.append(i)
            clock.now += 0.001  # each request's work takes a millisecond of the room

        tasks = [asyncio.create_task(request(i)) for i in range(2 * EVERY_STEP + 6)]
        await _settle()
        assert started == list(range(EVERY_STEP))
        pacer.open(clock.now + EVERY_STEP * 0.001 + ROOM_S + 0.0025)
        await _settle()
        # the step's quota, then three more while more than ROOM_S was left before it is due
        assert started == list(range(2 * EVERY_STEP + 3))
        pacer.open(None)  # idle: the rest start
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert started == list(range(2 * EVERY_STEP + 6))

    asyncio.run(go())


def test_a_request_that_leaves_while_waiting_gives_up_its_place() -> None:
    async def go() -> None:
        clock = Clock()
        pacer = AdmissionPacer(clock)
        pacer.open(clock.now)
        started: list[int] = []
        tasks = _requests(pacer, EVERY_STEP + 3, started)
        await _settle()
        assert started == list(range(EVERY_STEP))
        tasks[EVERY_STEP + 1].cancel()  # waiting in line
        pacer.open(clock.now)
        tasks[EVERY_STEP].cancel()  # woken, but gone before it ran
        await _settle()
        assert started == [*range(EVERY_STEP), EVERY_STEP + 2]
        assert pacer.waiting == 0

    asyncio.run(go())


class RecordingPacer(AdmissionPacer):
    def __init__(self) -> None:
        super().__init__()
        self.opened: list[float | None] = []

    def open(self, due: float | None) -> None:
        self.opened.append(due)
        super().open(due)


def test_the_loop_opens_each_step_with_its_due_time_and_idle_ticks_with_none(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        rt = _runtime(tmp_path)
        pacer = RecordingPacer()
        rt.loop.pacer = pacer
        rt.loop.start()
        streams = [_submit(rt, f"p{i}", 4) for i in range(2)]
        await asyncio.wait_for(asyncio.gather(*(s.wait_done() for s, _ in streams)), 10)
        await asyncio.sleep(0.2)  # idle ticks
        await rt.loop.stop()
        due = [d for d in pacer.opened if d is not None]
        assert len(due) >= rt.loop.stats.steps > 0
        assert pacer.opened[-1] is None

    asyncio.run(go())
