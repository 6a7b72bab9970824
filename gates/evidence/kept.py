"""The evidence a verdict keeps (`Verdict.evidence`, EvidenceReport.to_dict), read back check by
check for what shows it to people: junit.xml, summary.md, report.html and the console.

It reads the verdict, never the registry: a run judged months ago shows the checks that ran
then, with the descriptions they had, whatever checks are registered today.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gates.evidence.base import Effect, Finding

# Worst first: what a flagged check did to the run.
SEVERITY = (Effect.REFUSE, Effect.INVALID, Effect.NOTE)
# How each effect reads beside a check's name, in every surface.
EFFECT_TEXT = {
    Effect.REFUSE: "refused the input",
    Effect.INVALID: "makes the run INVALID",
    Effect.NOTE: "note",
}
# A single finding's effect, as a word before its message.
EFFECT_WORD = {Effect.REFUSE: "REFUSED", Effect.INVALID: "INVALID", Effect.NOTE: "note"}


@dataclass(frozen=True, slots=True)
class CheckSeen:
    """One evidence check of a verdict: its name, what it guards, and what it found (in the
    order it found them; none when the check was clean)."""

    name: str
    description: str
    findings: tuple[Finding, ...] = ()

    @property
    def effect(self) -> Effect | None:
        """The worst effect among its findings; None when the check was clean."""
        return next((e for e in SEVERITY if any(f.effect == e for f in self.findings)), None)

    @property
    def clean(self) -> bool:
        return not self.findings

    def result(self) -> str:
        """`clean`, or what its worst finding did: `makes the run INVALID`, `note`."""
        return "clean" if self.effect is None else EFFECT_TEXT[self.effect]


def checks_seen(evidence: Mapping[str, Any] | None) -> list[CheckSeen]:
    """Each check the verdict says ran, in the order it ran, with its findings; a finding
    whose check is not listed (a hand-edited verdict) still shows, under its own name.
    Empty for a verdict written before the evidence checks existed."""
    if not evidence:
        return []
    findings = [Finding.from_dict(f) for f in evidence.get("findings") or []]
    described: dict[str, str] = {}
    for check in evidence.get("checks") or []:
        described.setdefault(str(check["name"]), str(check.get("description") or ""))
    for finding in findings:
        described.setdefault(finding.check, "")
    return [
        CheckSeen(name, description, tuple(f for f in findings if f.check == name))
        for name, description in described.items()
    ]


def tally(checks: Sequence[CheckSeen]) -> str:
    """`8 ran, all clean`, or `8 ran, 6 clean; flagged: clocks (makes the run INVALID),
    duplicates (note)`: the evidence stage in one phrase."""
    if not checks:
        return "none ran"
    flagged = [c for c in checks if not c.clean]
    if not flagged:
        return f"{len(checks)} ran, all clean"
    shown = ", ".join(f"{c.name} ({c.result()})" for c in flagged)
    return f"{len(checks)} ran, {len(checks) - len(flagged)} clean; flagged: {shown}"
