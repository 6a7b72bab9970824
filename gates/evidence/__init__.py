"""The evidence stage: every registered check over a run, before any gate (base.py says why).

Every module `gates/evidence/checks_*.py` is imported here, in name order, and its
`@evidence_check` functions register themselves: a new check is one module, or one function
in an existing one.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from gates.evidence.base import (
    CHECKS,
    CheckDef,
    Effect,
    EvidenceReport,
    Finding,
    evidence_check,
    flagged,
)
from gates.rundir import RunData, RunDirError

MODULE_PREFIX = "checks_"


class EvidenceRefused(RunDirError):
    """The run directory breaks the contract in a way no verdict may be built on."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        lines = "\n".join(f"  {f.text()}" for f in findings)
        super().__init__(
            f"the run directory breaks its contract; nothing was judged:\n{lines}\n"
            "fix what wrote the run, or re-run; kvgate never guesses a value"
        )


def _discover() -> tuple[ModuleType, ...]:
    names = sorted(m.name for m in pkgutil.iter_modules(__path__))
    return tuple(
        importlib.import_module(f"{__name__}.{name}")
        for name in names
        if name.startswith(MODULE_PREFIX)
    )


MODULES = _discover()


# Checks with an order below CORRECTING only look for input to refuse: the rest may assume
# every value lies in its column's domain, so they run only when nothing was refused.
CORRECTING = 100


def check_evidence(run: RunData) -> EvidenceReport:
    """Run every check over `run` in order (checks may correct its tables, and say so), keep
    the report on `run.evidence` and return it; a run already checked is not checked again.
    Raises EvidenceRefused when any check refuses the input."""
    if isinstance(run.evidence, EvidenceReport):
        return run.evidence
    report = EvidenceReport()
    for check in sorted(CHECKS.values(), key=lambda c: (c.order, c.name)):
        if check.order >= CORRECTING and report.refusals:
            break
        report.checks.append(check.name)
        report.findings.extend(check.fn(run))
    if report.refusals:
        raise EvidenceRefused(report.refusals)
    run.cache.clear()  # a correction changes what every metric computed from
    run.evidence = report
    return report


__all__ = [
    "CHECKS",
    "CORRECTING",
    "MODULES",
    "CheckDef",
    "Effect",
    "EvidenceRefused",
    "EvidenceReport",
    "Finding",
    "check_evidence",
    "evidence_check",
    "flagged",
]
