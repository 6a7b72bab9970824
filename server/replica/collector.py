"""The replica's cyclic garbage collection, run by the step loop in the room its steps leave.

Left automatic, Python's collector runs whenever enough objects have been allocated: in the
middle of a burst of requests, or just as a step falls due. At 500 streams a pass over the
young objects took 10 to 20 ms and a full pass 15 to 25 ms, each on top of the step it
interrupted. A replica that calls `take_over` turns automatic collection off; its step loop
then offers the collector the time until the next step is due, once the step's work is done.
Young passes are short and run whenever enough young objects have piled up. A full pass runs
when one is due and the room offered fits it (a long prefill step, an idle tick), or, if no
step leaves that much room, when it is overdue.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

# A young pass costs about a microsecond per young object: a few milliseconds at most, and
# taken often enough that young cyclic garbage (a cancelled request's exception) goes early.
YOUNG_OBJECTS = 2_000
# A full pass (every object made since start-up) is due this long after the last one...
FULL_PERIOD_S = 10.0
# ...and overdue this long after it: it then runs in whatever room there is. Cyclic garbage
# that outlives a young pass is rare here (a few dozen objects in thousands of requests), so
# holding it a few minutes costs little memory.
FULL_OVERDUE_S = 300.0
# A full pass is taken to fit when the room is this many times its last duration: on a
# busy machine a pass of 17 ms of CPU took 29 ms of wall time in a plan run.
FIT_MARGIN = 3.0


class StepCollector:
    """Decides which pass, if any, fits the room the step loop offers. Invariant: once
    `take_over` has run, no collection happens in this process except the ones `collect_in`
    starts (or someone's explicit `gc.collect()`)."""

    def __init__(
        self, full_pass_s: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._last_full = clock()
        self.full_pass_s = full_pass_s  # how long the last full pass took

    @classmethod
    def take_over(cls) -> StepCollector:
        """Collect once, freeze what start-up built (config, tokenizer, app: never garbage)
        out of every later pass, and turn automatic collection off for this process. The
        first full pass, over more objects than any later one, is the first estimate of one."""
        started = time.perf_counter()
        gc.collect()
        took = time.perf_counter() - started
        gc.freeze()
        gc.disable()
        return cls(full_pass_s=took)

    def collect_in(self, room_s: float) -> None:
        """Run the pass that is due and fits in `room_s` seconds (the time until the next step
        is due; negative when it is already late)."""
        now = self._clock()
        since_full = now - self._last_full
        fits = room_s >= FIT_MARGIN * self.full_pass_s
        if since_full >= FULL_OVERDUE_S or (since_full >= FULL_PERIOD_S and fits):
            started = time.perf_counter()
            gc.collect()
            self.full_pass_s = time.perf_counter() - started
            self._last_full = now
        elif gc.get_count()[0] >= YOUNG_OBJECTS:
            gc.collect(0)
