"""A toy evidence check, registered only inside `registered(effect)`: it flags every request of
the tenant `ghost` (a tenant no plan defines) with the effect the test asks for, so that what
shows the evidence can be tested over a real evaluation without the real checks' rules."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from gates.evidence import CHECKS, Effect, Finding, evidence_check, flagged
from gates.rundir import RunData
from tests.gates.builder import RunBuilder

NAME = "toy_ghost_tenant"
ORDER = 900  # after every real check: it judges what they left
FINDING = (
    f"{NAME}: 2 request(s) of tenant ghost, which no plan defines [requests.tenant, rows 1, 3]"
)


@contextmanager
def registered(effect: Effect | str = Effect.NOTE) -> Iterator[str]:
    """The toy check, registered with `effect` until the block ends; yields its name."""

    def ghost_tenant(run: RunData) -> list[Finding]:
        """Every request belongs to a tenant of the plan."""
        rows = np.flatnonzero(run.requests["tenant"].eq("ghost").to_numpy())
        if not len(rows):
            return []
        message = f"{len(rows)} request(s) of tenant ghost, which no plan defines"
        return [flagged(NAME, Effect(effect), message, "requests", rows.tolist(), "tenant")]

    evidence_check(NAME, order=ORDER)(ghost_tenant)
    try:
        yield NAME
    finally:
        CHECKS.pop(NAME, None)


def ghost_builder() -> RunBuilder:
    """Four answered requests; the second and the fourth of the tenant the toy check flags."""
    b = RunBuilder()
    for i, tenant in enumerate(("acme", "ghost", "acme", "ghost")):
        b.request(f"r{i}", t=20.0 + i, tenant=tenant, ttft_s=0.2)
    return b
