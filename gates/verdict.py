"""Verdict data: per-gate results and the run's overall verdict, as written to verdict.json."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    PASS = "PASS"
    MARGINAL = "MARGINAL"
    FAIL = "FAIL"
    INVALID = "INVALID"


EXIT_CODES = {Status.PASS: 0, Status.FAIL: 3, Status.MARGINAL: 4, Status.INVALID: 5}
EXIT_USAGE = 2
# The weighted score is the share of gate weight that did not fail (MARGINAL is not a failure).
SCORE = {Status.PASS: 1.0, Status.MARGINAL: 1.0, Status.FAIL: 0.0, Status.INVALID: 0.0}


@dataclass(slots=True)
class GateResult:
    """One gate's judgement; `value` is None when the run had no data for it."""

    id: str
    title: str
    metric: str
    key: bool
    weight: float
    status: Status
    statistic: str
    threshold: str
    warn: str | None
    value: float | None
    n_samples: int
    message: str
    filter: dict[str, Any]
    unit: str = ""
    first_breach_t: float | None = None
    breaches: int = 0
    evidence: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Verdict:
    """The overall verdict. Invariant: `status` follows from `gates` and `run_problems`."""

    status: Status
    gates: list[GateResult]
    run_problems: list[str]
    score: float
    run_dir: str
    gates_file: str
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def failed(self) -> list[GateResult]:
        """Gates that are not PASS, worst first (FAIL, INVALID, MARGINAL), key gates first."""
        order = {Status.FAIL: 0, Status.INVALID: 1, Status.MARGINAL: 2}
        bad = [g for g in self.gates if g.status != Status.PASS]
        return sorted(bad, key=lambda g: (order[g.status], not g.key))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["exit_code"] = self.exit_code
        cleaned: dict[str, Any] = _clean(data)
        return cleaned

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        gates = [GateResult(**{**g, "status": Status(g["status"])}) for g in data["gates"]]
        return cls(
            status=Status(data["status"]),
            gates=gates,
            run_problems=list(data["run_problems"]),
            score=float(data["score"]),
            run_dir=str(data["run_dir"]),
            gates_file=str(data["gates_file"]),
            notes=list(data.get("notes", [])),
        )


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become None, numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, StrEnum):
        return str(value)
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
