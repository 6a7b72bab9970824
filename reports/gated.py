"""What the gates judge, as the charts draw it: the TTFT gate's line and the requests it
judges, read from the verdict (the gate on metric `ttft`) so a chart shows the line the run
was judged by; the load start as the time origin; the faults as spans."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from pydantic import ValidationError

from gates.metrics import REGISTRY
from gates.rundir import RunData
from gates.spec import GateSpecError, load_gate_file
from gates.terms import GateFilter, Threshold
from gates.verdict import Verdict
from gates.windows import resolve_window


@dataclass(frozen=True, slots=True)
class TtftGate:
    """The TTFT gate a chart draws: its line, its id and the requests it judges."""

    gate_id: str
    threshold: Threshold
    filter: GateFilter
    from_verdict: bool  # False: the verdict has no TTFT gate, this is the built-in one

    def covers(self, traffic_class: str, priority: str) -> bool:
        flt = self.filter
        return (not flt.traffic_class or traffic_class in flt.traffic_class) and (
            not flt.priority or priority in flt.priority
        )


def ttft_gate(verdict: Verdict | None) -> TtftGate | None:
    """The verdict's gate on metric `ttft` (one about critical traffic first); without one,
    the built-in gate file's; None when neither has a usable one."""
    gates = [g for g in verdict.gates if g.metric == "ttft"] if verdict is not None else []
    gates.sort(key=lambda g: "critical" not in (g.filter.get("priority") or []))
    for g in gates:
        try:
            flt = GateFilter(**{k: v for k, v in g.filter.items() if v is not None})
            return TtftGate(g.id, Threshold.model_validate(g.threshold), flt, True)
        except (ValidationError, TypeError):
            continue  # a threshold or filter this version cannot read: try the next
    try:
        specs = load_gate_file().gates
    except GateSpecError:
        return None
    spec = next((g for g in specs if g.metric == "ttft"), None)
    return None if spec is None else TtftGate(spec.id, spec.pass_, spec.filter, False)


def describe_filter(gate: TtftGate | None) -> str:
    """`critical short_qa`: the requests a TTFT gate judges, in words."""
    if gate is None:
        return "critical short_qa"
    flt = gate.filter
    words = [", ".join(v) for v in (flt.priority, flt.traffic_class, flt.tenant) if v]
    return " ".join(words) or "every"


def load_start(run: RunData) -> float:
    """Epoch seconds the load began (the stress window's start), else the run's start."""
    stress = resolve_window(run, "stress")
    return float(stress[0][0]) if isinstance(stress, list) else run.t_start


def ttft_observations(run: RunData, gate: TtftGate | None) -> tuple[pd.DataFrame, float]:
    """The TTFT observations the gate judges (value, request_id, t = send time; a request
    that never got a first token is +inf), computed by the gate's own metric, and the
    load start as the time origin."""
    flt = (
        gate.filter
        if gate is not None
        else GateFilter(traffic_class=["short_qa"], priority=["critical"])
    )
    obs = REGISTRY["ttft"].compute(run, flt, {})
    frame = obs.frame
    if "t" not in frame:
        frame = pd.DataFrame({"value": [], "request_id": [], "t": []})
    return frame.sort_values("t"), load_start(run)


def fault_spans(run: RunData) -> list[tuple[float, float | None, str]]:
    """Each injected fault as (epoch start, epoch end or None, label)."""
    faults = run.faults.dropna(subset=["t_start"])
    return [
        (
            float(f.t_start),
            float(f.t_end) if pd.notna(f.t_end) else None,
            f"{f.kind} {f.target}",
        )
        for f in faults.itertuples()
    ]
