"""Evidence checks: what a run directory must show before any gate may judge it.

A gate judges the records it is given. Records that cannot be trusted (the same request
twice, clocks that disagree, a run that never finished, values outside the contract,
impossible numbers) would make it judge a lie, so each kind of distrust is a named check
that runs before the gates (gates/evidence/__init__.py runs them all, in `order`).

A check reads a `RunData` and returns findings. Each finding has one effect:
- `refuse`: the input breaks the run-directory contract (a priority nobody defined, a
  negative TTFT). Nothing is judged; `kvgate gate` exits 2 naming table, column and row.
- `invalid`: the run cannot be trusted as a whole (it was interrupted, its clocks cannot be
  reconciled). The verdict is INVALID with the reason, unless a gate failed in a way that
  no evidence could undo (gates/evaluator.py, rule 1): then it still FAILs.
- `note`: the run is judged, and the verdict says what the check saw or corrected.

A check may correct the run before the gates read it (drop a row written twice, shift a
clock by a tight estimate of its offset); it then says so in a finding, so that what was
judged is never different from what was read without a word.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gates.rundir import RunData


class Effect(StrEnum):
    REFUSE = "refuse"
    INVALID = "invalid"
    NOTE = "note"


ROWS_SHOWN = 10  # flagged rows a finding names; `n_rows` counts them all


@dataclass(frozen=True, slots=True)
class Finding:
    """What one check saw: its effect, a message a release manager can act on, and the
    rows it flagged (positions in the table as read, 0-based; the first ROWS_SHOWN)."""

    check: str
    effect: Effect
    message: str
    table: str | None = None
    column: str | None = None
    rows: tuple[int, ...] = ()
    n_rows: int = 0
    # The finding puts the run's clocks in doubt (an offset between the client's and the
    # server's clocks that cannot be bounded): no timing breach can then prove itself, as
    # with a load generator over its CPU budget (gates/evaluator.py, rule 1).
    doubts_timing: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "effect": str(self.effect),
            "message": self.message,
            "table": self.table,
            "column": self.column,
            "rows": list(self.rows),
            "n_rows": self.n_rows,
            "doubts_timing": self.doubts_timing,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            check=str(data["check"]),
            effect=Effect(data["effect"]),
            message=str(data["message"]),
            table=data.get("table"),
            column=data.get("column"),
            rows=tuple(int(r) for r in data.get("rows") or ()),
            n_rows=int(data.get("n_rows") or 0),
            doubts_timing=bool(data.get("doubts_timing")),
        )

    def where(self) -> str:
        """`requests.priority, rows 3, 7 (2 in all)`, or "" when it names no rows."""
        place = ".".join(p for p in (self.table, self.column) if p)
        if not self.rows:
            return place
        shown = ", ".join(str(r) for r in self.rows)
        more = f" ({self.n_rows} in all)" if self.n_rows > len(self.rows) else ""
        return f"{place}, row{'s' if len(self.rows) > 1 else ''} {shown}{more}"

    def text(self) -> str:
        where = self.where()
        return f"{self.check}: {self.message}" + (f" [{where}]" if where else "")


def flagged(
    check: str,
    effect: Effect,
    message: str,
    table: str,
    positions: Sequence[int],
    column: str | None = None,
) -> Finding:
    """A finding over the rows at `positions` of `table` (the first ROWS_SHOWN named)."""
    ordered = sorted(int(p) for p in positions)
    return Finding(
        check=check,
        effect=effect,
        message=message,
        table=table,
        column=column,
        rows=tuple(ordered[:ROWS_SHOWN]),
        n_rows=len(ordered),
    )


CheckFn = Callable[[RunData], list[Finding]]


@dataclass(frozen=True, slots=True)
class CheckDef:
    """A registered check: its name, when it runs (lower first) and what it guards."""

    name: str
    fn: CheckFn
    order: int
    description: str


CHECKS: dict[str, CheckDef] = {}


def evidence_check(name: str, *, order: int) -> Callable[[CheckFn], CheckFn]:
    """Register `fn` as evidence check `name`. Checks run in `order` (lower first): those
    that refuse malformed input first, then those that correct the records (duplicates,
    clocks), then those that judge the run as a whole on what is left. The docstring's
    first line is the description the reports show."""

    def register(fn: CheckFn) -> CheckFn:
        if name in CHECKS:
            raise ValueError(f"evidence check {name!r} registered twice")
        doc = (fn.__doc__ or name).strip().splitlines()[0]
        CHECKS[name] = CheckDef(name=name, fn=fn, order=order, description=doc)
        return fn

    return register


@dataclass(slots=True)
class EvidenceReport:
    """Every check that ran and what each found; empty `findings` means clean evidence."""

    checks: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def of(self, effect: Effect) -> list[Finding]:
        return [f for f in self.findings if f.effect == effect]

    @property
    def refusals(self) -> list[Finding]:
        return self.of(Effect.REFUSE)

    @property
    def problems(self) -> list[str]:
        """Why the run cannot be trusted: the reasons its verdict is INVALID."""
        return [f.text() for f in self.of(Effect.INVALID)]

    @property
    def doubts_timing(self) -> bool:
        return any(f.doubts_timing for f in self.of(Effect.INVALID))

    @property
    def notes(self) -> list[str]:
        return [f.text() for f in self.of(Effect.NOTE)]

    def to_dict(self) -> dict[str, Any]:
        flagged_by = {f.check for f in self.findings}
        return {
            "checks": [
                {
                    "name": name,
                    "description": CHECKS[name].description if name in CHECKS else "",
                    "clean": name not in flagged_by,
                }
                for name in self.checks
            ],
            "findings": [f.to_dict() for f in self.findings],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EvidenceReport:
        if not data:
            return cls()
        return cls(
            checks=[str(c["name"]) for c in data.get("checks") or []],
            findings=[Finding.from_dict(f) for f in data.get("findings") or []],
        )
