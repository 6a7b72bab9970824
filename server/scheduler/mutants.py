"""The named scheduler and server bugs (mutants) the reference server can carry, off by default.

`contract.MUTANTS` holds each one's name, summary and the gates that must catch it; this enum
is the server's handle on the same names (a test keeps the two equal). A mutant is switched
on for a whole deployment (`kvgate serve --mutant NAME`) so `kvgate qualify` can prove each
release gate catches the bug it exists for. Code that carries a bug reads `Mutant.X in ...`
at the one place the bug lives.
"""

from __future__ import annotations

import enum


class Mutant(enum.Enum):
    SLOW_RELEASE = "slow_release"
    LEAK_ON_CANCEL = "leak_on_cancel"
    NO_TENANT_CAP = "no_tenant_cap"
    DROP_PREEMPTED = "drop_preempted"
    PREEMPT_BY_AGE = "preempt_by_age"
    BATCH_IGNORES_PEAK = "batch_ignores_peak"
    QUEUE_INSTEAD_OF_REFUSE = "queue_instead_of_refuse"
    DOUBLE_HOLD_AFTER_FAILOVER = "double_hold_after_failover"
    UNDERESTIMATE_KV = "underestimate_kv"
    TRUST_PRIORITY_HEADER = "trust_priority_header"
    SHARED_PRIVATE_PREFIX = "shared_private_prefix"


def parse_mutant(name: str | None) -> Mutant | None:
    """The mutant called `name`, or None for the correct server; ValueError names the choices."""
    if not name:
        return None
    try:
        return Mutant(name)
    except ValueError:
        choices = ", ".join(m.value for m in Mutant)
        raise ValueError(f"unknown mutant {name!r}; choose one of {choices}") from None


# How often leak_on_cancel leaks: one cancellation in this many keeps its blocks forever.
LEAK_EVERY = 20
# How late slow_release frees a cancelled request's blocks.
SLOW_RELEASE_S = 3.0
