"""Verdict data: per-gate results and the run's overall verdict, as written to verdict.json."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from gates.metrics import REGISTRY
from gates.spec import GateFile, GateSpecError, checked_gate_file
from gates.terms import Cause


def timing_could_fake(timing: bool, value: float | None) -> bool:
    """Whether doubtful clocks (a lagging simulator, a load generator over its CPU budget)
    could have produced a gate's `value`: yes for a finite value of a timing metric; no for
    any other metric, and no for +inf, an answer or a release that never came. A busy
    machine makes things late; it does not make them vanish, so a leak is never excused.
    The run's verdict (gates/evaluator.py) and the rollback rules (reports/decide.py) both
    excuse a breach on untrusted timings through this rule alone."""
    return timing and not (value is not None and math.isinf(value))


class Status(StrEnum):
    PASS = "PASS"
    MARGINAL = "MARGINAL"
    FAIL = "FAIL"
    INVALID = "INVALID"
    # The gate does not apply to this target: it needs data the target cannot give. It is
    # left out of the verdict and its score, and says why.
    NA = "N/A"


EXIT_CODES = {Status.PASS: 0, Status.FAIL: 3, Status.MARGINAL: 4, Status.INVALID: 5}
EXIT_USAGE = 2
# The weighted score is the share of gate weight that did not fail (MARGINAL is not a failure).
SCORE = {
    Status.PASS: 1.0,
    Status.MARGINAL: 1.0,
    Status.FAIL: 0.0,
    Status.INVALID: 0.0,
    Status.NA: 0.0,  # never scored: N/A gates are left out of the score's weights
}


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
    # The metric's declarations (gates/registry.py), so that no reader of a verdict needs
    # the registry: whether its value is a time on the run's clocks, and the rollback cause
    # a failure points to with the weight of that evidence.
    timing: bool
    cause: Cause
    cause_weight: int = 1
    unit: str = ""
    first_breach_t: float | None = None
    breaches: int = 0
    evidence: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The statistic's two-sided interval at `confidence` ([lo, hi]; an end the sample cannot
    # bound is -inf/+inf, "-inf"/"inf" in JSON), how it was computed, and whether the
    # threshold's line falls inside it.
    interval: list[float] | None = None
    confidence: float = 0.95
    method: str = ""
    straddles: bool = False
    # Samples a conclusive judgement would need at the observed rate/distribution.
    needs_n: int | None = None
    # Observations counted as breaches because they never got a value (no first token,
    # a release that never came).
    censored: int = 0
    # A FAIL of this gate fails the run by itself (the gate file's `blocks`, else `key`),
    # and why, as the gate file says (None in a verdict.json written before reasons were
    # kept, and for a gate that does not block).
    blocks: bool = False
    blocks_because: str | None = None
    # The gate as it judged (GateSpec.resolved): every key after `extends` and the defaults,
    # params over the metric's defaults. Empty in a verdict.json written before it was kept.
    spec: dict[str, Any] = field(default_factory=dict)

    def timing_could_fake(self) -> bool:
        """Whether untrusted timings could explain this gate's value (`timing_could_fake`)."""
        return timing_could_fake(self.timing, self.value)

    def value_text(self) -> str:
        """`p95 = 0.56 s [0.49, 0.71], n = 127`: the one way every output shows a gate's value."""
        if self.status == Status.NA:
            return "not applicable to this target"
        if self.value is None:
            return f"{self.statistic}: no data, n = {self.n_samples}"
        unit = " s" if self.unit == "s" else ""
        text = f"{self.statistic} = {_number(self.value)}{unit}"
        if self.interval is not None and self.interval[0] != self.interval[1]:
            lo, hi = self.interval
            text += f" [{_number(lo)}, {_number(hi)}]"
        text += f", n = {self.n_samples}"
        if self.censored:
            text += f" ({self.censored} censored)"
        return text

    def caveats(self) -> list[str]:
        """What a reader must know before trusting the status: printed beside `value_text()`.

        "needs >= N samples" is left out of a PASS, which is conclusive by definition.
        """
        out = ["interval straddles the line"] if self.straddles else []
        if self.needs_n is not None and self.status != Status.PASS:
            out.append(f"needs >= {self.needs_n} samples")
        return out


def _number(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


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
    # The gate file's score floor, and the server profile the gates read: its kind and where
    # it came from (the snapshot in meta.json, or a profile file as it is today). None / empty
    # in a verdict.json written before they were kept.
    fail_score_below: float | None = None
    profile: dict[str, str] = field(default_factory=dict)
    # What the evidence checks ran and found before any gate (gates/evidence:
    # EvidenceReport.to_dict); empty in a verdict.json written before they existed.
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def failed(self) -> list[GateResult]:
        """Gates that are not PASS, worst first (FAIL, INVALID, MARGINAL), key gates first."""
        order = {Status.FAIL: 0, Status.INVALID: 1, Status.MARGINAL: 2}
        bad = [g for g in self.gates if g.status not in (Status.PASS, Status.NA)]
        return sorted(bad, key=lambda g: (order[g.status], not g.key))

    @property
    def not_applicable(self) -> list[GateResult]:
        """Gates left out because the target cannot give the data they need."""
        return [g for g in self.gates if g.status == Status.NA]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["exit_code"] = self.exit_code
        for gate in data["gates"]:
            # JSON has no infinity; a censored statistic (+inf) must not read as "no data".
            gate["value"] = _infinity_out(gate["value"])
            if gate["interval"] is not None:
                gate["interval"] = [_infinity_out(v) for v in gate["interval"]]
        cleaned: dict[str, Any] = _clean(data)
        return cleaned

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        gates = []
        for g in data["gates"]:
            fields = {
                **_with_declarations(g),
                "status": Status(g["status"]),
                "value": _infinity_in(g.get("value")),
            }
            if g.get("interval") is not None:
                fields["interval"] = [_infinity_in(v) for v in g["interval"]]
            gates.append(GateResult(**fields))
        return cls(
            status=Status(data["status"]),
            gates=gates,
            run_problems=list(data["run_problems"]),
            score=float(data["score"]),
            run_dir=str(data["run_dir"]),
            gates_file=str(data["gates_file"]),
            notes=list(data.get("notes", [])),
            fail_score_below=data.get("fail_score_below"),
            profile=dict(data.get("profile") or {}),
            evidence=dict(data.get("evidence") or {}),
        )

    def gate_file(self) -> GateFile:
        """The gates this verdict was judged by, rebuilt from what it keeps of each, so the
        run can be judged again by the same gates whatever the gate files say today."""
        kept = [g.spec for g in self.gates]
        if not kept or not all(kept) or self.fail_score_below is None:
            raise GateSpecError(
                f"the verdict of {self.run_dir} does not keep the gates it was judged by (it "
                "was written by an older kvgate); judge the run again with `kvgate gate "
                "RUN_DIR --gates FILE`"
            )
        try:
            return checked_gate_file(
                {"fail_score_below": self.fail_score_below, "gates": kept},
                f"the gates the verdict of {self.run_dir} keeps do not read back",
                kept=True,
            )
        except GateSpecError as exc:
            raise GateSpecError(
                f"{exc}\njudge the run again with `kvgate gate RUN_DIR --gates FILE`"
            ) from exc


def _with_declarations(gate: dict[str, Any]) -> dict[str, Any]:
    """A gate of verdict.json with its metric's declarations. A verdict written before gates
    carried them takes them from today's registry: the one place they are ever derived."""
    if "timing" in gate:
        return {**gate, "cause": Cause(gate["cause"])}
    definition = REGISTRY.get(gate["metric"])
    if definition is None:
        raise ValueError(
            f"gate {gate.get('id')!r}: its metric {gate['metric']!r} is no longer registered "
            "and the verdict predates declared timing; judge the run again (kvgate gate RUN_DIR)"
        )
    return {
        **gate,
        "timing": definition.timing,
        "cause": definition.cause,
        "cause_weight": definition.cause_weight,
    }


def _infinity_out(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _infinity_in(value: Any) -> Any:
    return float(value) if value in ("inf", "-inf") else value


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
