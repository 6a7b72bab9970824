"""Hand-made gate results and verdicts carrying intervals, for the report and JUnit tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gates.evidence.base import Effect, EvidenceReport, Finding
from gates.metrics import REGISTRY
from gates.verdict import GateResult, Status, Verdict

TTFT_TITLE = "P95 TTFT of critical interactive requests at most 900 ms"


def declared(metric: str) -> dict[str, Any]:
    """What the registry declares of `metric`, as a gate result carries it."""
    d = REGISTRY[metric]
    return {"timing": d.timing, "cause": d.cause, "cause_weight": d.cause_weight}


def ttft_gate(**changes: Any) -> GateResult:
    gate = GateResult(
        id="ttft_critical_p95",
        title=TTFT_TITLE,
        metric="ttft",
        key=True,
        weight=2.0,
        status=Status.PASS,
        statistic="p(95)",
        threshold="p(95) <= 900ms",
        warn=None,
        value=0.56,
        n_samples=127,
        message="p(95) = 0.56 s is at most 0.9 s even at the interval's top (0.71 s)",
        filter={"traffic_class": ["short_qa"], "priority": ["critical"], "window": "all"},
        **declared("ttft"),
        unit="s",
        interval=[0.49, 0.71],
        method="order statistics",
    )
    return replace(gate, **changes)


def straddling_ttft_gate() -> GateResult:
    """A TTFT gate whose value meets its line while its interval reaches past it."""
    return ttft_gate(
        status=Status.MARGINAL,
        value=0.86,
        interval=[0.79, 0.95],
        straddles=True,
        needs_n=480,
        message="p(95) = 0.86 s meets 0.9 s but its interval reaches 0.95 s",
    )


def oom_gate(**changes: Any) -> GateResult:
    gate = GateResult(
        id="no_oom",
        title="Zero OOM during the stress window",
        metric="oom_events",
        key=True,
        weight=3.0,
        status=Status.PASS,
        statistic="count",
        threshold="count == 0",
        warn=None,
        value=0.0,
        n_samples=40,
        message="no OOM",
        filter={"window": "stress"},
        **declared("oom_events"),
        unit="count",
    )
    return replace(gate, **changes)


def verdict(status: Status, *gates: GateResult) -> Verdict:
    return Verdict(
        status=status,
        gates=list(gates),
        run_problems=[],
        score=1.0,
        run_dir="run",
        gates_file="builtin",
    )


# Hand-made evidence findings, as verdict.json keeps them (EvidenceReport.to_dict): the checks
# are named here, not registered, so the surfaces are tested on what a verdict says alone.
DESCRIPTIONS = {
    "unique_request_ids": "Each request id appears once in the requests table.",
    "clock_offset": "Client and server clocks agree within a bound.",
    "run_window": "The run finished its planned window.",
}
CLOCKS = Finding(
    check="clock_offset",
    effect=Effect.INVALID,
    message="client and server clocks disagree by 2.5 s, beyond the 0.5 s bound",
    table="server_events",
    column="t",
    rows=(3, 7),
    n_rows=12,
    doubts_timing=True,
)
TWICE = Finding(
    check="unique_request_ids",
    effect=Effect.NOTE,
    message="dropped 2 rows written twice",
    table="requests",
    column="request_id",
    rows=(4, 9),
    n_rows=2,
)


def evidence(*findings: Finding) -> dict[str, Any]:
    """Verdict.evidence with every check of DESCRIPTIONS run, and these findings."""
    flagged = {f.check for f in findings}
    return {
        "checks": [
            {"name": n, "description": d, "clean": n not in flagged}
            for n, d in DESCRIPTIONS.items()
        ],
        "findings": [f.to_dict() for f in findings],
    }


def with_evidence(judged: Verdict, *findings: Finding) -> Verdict:
    """`judged` with these findings, their texts in run_problems and notes as the evaluator
    puts them there."""
    report = EvidenceReport(list(DESCRIPTIONS), list(findings))
    return replace(
        judged,
        evidence=evidence(*findings),
        run_problems=[*judged.run_problems, *report.problems],
        notes=[*judged.notes, *report.notes],
    )
