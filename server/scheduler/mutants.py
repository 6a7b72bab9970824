"""The named scheduler and server bugs (mutants) the reference server can carry, off by default.

`contract.Mutant` names them and `contract.MUTANTS` holds each one's summary and the gates
that must catch it; this module parses a name and holds the numbers of the bugs that have
one. A mutant is switched on for a whole deployment (`kvgate serve --mutant NAME`) so
`kvgate qualify` can prove each release gate catches the bug it exists for. Code that carries
a bug reads `Mutant.X in ...` at the one place the bug lives.
"""

from __future__ import annotations

from contract import Mutant


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
