"""The replica's cyclic garbage collection, run by the step loop between steps.

Left automatic, Python's collector runs whenever enough objects have been allocated: in the
middle of a burst of requests, or just as a step falls due. At 500 streams a pass over the
young objects took 10 to 20 ms and a full pass about as long, and each came on top of the
step it interrupted. A replica that calls `take_over` turns automatic collection off and its
step loop runs each pass right after a step's tokens are written, when the next step is
furthest away, so a pass overlaps the simulated step instead of delaying it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

# A young pass costs about a microsecond per young object: a few milliseconds at most, and
# taken often enough that cyclic garbage from cancelled or failed requests goes promptly.
YOUNG_OBJECTS = 2_000
# As Python's default thresholds: every tenth pass also looks at the middle generation.
MIDDLE_EVERY = 10
# A full pass (all objects made since start-up) at most this often while the replica is busy.
FULL_PERIOD_S = 10.0


class StepCollector:
    """Decides which generation, if any, to collect after a step. Invariant: once `take_over`
    has run, no collection happens in this process except the ones `after_step` starts (or
    someone's explicit `gc.collect()`)."""

    def __init__(
        self,
        young_objects: int = YOUNG_OBJECTS,
        full_period_s: float = FULL_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.young_objects = young_objects
        self.full_period_s = full_period_s
        self._clock = clock
        self._young_passes = 0
        self._last_full = clock()

    @classmethod
    def take_over(cls) -> StepCollector:
        """Collect once, freeze what start-up built (config, tokenizer, app: never garbage)
        out of every later pass, and turn automatic collection off for this process."""
        gc.collect()
        gc.freeze()
        gc.disable()
        return cls()

    def after_step(self) -> None:
        """Called by the step loop once a step's (or an idle tick's) work is done."""
        if gc.get_count()[0] < self.young_objects:
            return
        now = self._clock()
        if now - self._last_full >= self.full_period_s:
            generation = 2
            self._last_full = now
            self._young_passes = 0
        elif self._young_passes + 1 >= MIDDLE_EVERY:
            generation = 1
            self._young_passes = 0
        else:
            generation = 0
            self._young_passes += 1
        gc.collect(generation)
