"""The replica's named bug (server.scheduler.mutants has the scheduler's): a subclass of the
step loop that the replica builds instead of StepLoop when the deployment carries it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from contract import Mutant
from server.replica.loop import StepLoop

# How late slow_release frees a cancelled request's blocks.
SLOW_RELEASE_S = 3.0


class SlowRelease(StepLoop):
    """The blocks of a cancelled request are freed SLOW_RELEASE_S late: the abort is acted on
    late, and the release-latency histogram never hears of it."""

    def _release_cancelled(self, request_id: str, reason: str, t0: float) -> None:
        asyncio.get_running_loop().call_later(SLOW_RELEASE_S, self._release, request_id, reason)


STEP_LOOPS: Final[Mapping[Mutant, type[StepLoop]]] = MappingProxyType(
    {Mutant.SLOW_RELEASE: SlowRelease}
)


def step_loop_class(mutant: Mutant | None) -> type[StepLoop]:
    """The step loop to build for a deployment carrying `mutant` (StepLoop for most)."""
    return StepLoop if mutant is None else STEP_LOOPS.get(mutant, StepLoop)
