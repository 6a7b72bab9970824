"""A plan's sample plan: every key and blocking gate's need against what the load will
give it, as the table `kvgate plan check` prints, the lines `kvgate run` prints before the
load, and JSON."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from locust import User

from gates.spec import GateFile
from harness.plan import Plan, PlanError, VllmTarget
from harness.sampleplan.calibrate import Measured, calibrated
from harness.sampleplan.expect import GateNeed, Reach, Source, expected, needed, not_applicable
from harness.sampleplan.traffic import TrafficModel, model
from harness.traffic import target_profile

# `kvgate plan check` exit codes (0: every key gate reaches its samples; 2: bad input).
EXIT_OK, EXIT_SHORT, EXIT_UNKNOWN = 0, 4, 5
# What kvgate's scheduler recorder in a vLLM it starts adds to the profile's data
# (harness/engines/vllm.py): every request's admission, preemption and release.
RECORDER_GIVES = frozenset({"server_events", "release_timing", "preemption_count"})
MARK = {Source.ASSUMED: "a", Source.MEASURED: "m", Source.PLAN: "p", Source.UNKNOWN: "?"}


@dataclass(slots=True)
class SamplePlan:
    """Every key and blocking gate of a plan's gate file, in the file's order, against the
    plan's traffic (and the run that measured it, if any)."""

    plan: str
    shape: str
    load_s: float
    gates: list[GateNeed]
    traffic: TrafficModel
    measured: Measured | None = None
    notes: list[str] = field(default_factory=list)
    # load.until: decided: needs are the anytime-valid bound's, within up to load_s of load
    anytime: bool = False

    @property
    def key(self) -> list[GateNeed]:
        return [g for g in self.gates if g.key and g.reach is not Reach.NA]

    @property
    def short(self) -> list[GateNeed]:
        return [g for g in self.key if g.reach is Reach.SHORT]

    @property
    def exit_code(self) -> int:
        if self.short:
            return EXIT_SHORT
        return EXIT_UNKNOWN if any(g.reach is Reach.UNKNOWN for g in self.key) else EXIT_OK

    def load_needed_s(self) -> float | None:
        """Seconds of load (at this mix) every short key gate would need, if time can say."""
        times = [g.time_needed_s for g in self.short]
        if not times or any(t is None or math.isinf(t) for t in times):
            return None
        return max(t for t in times if t is not None) + self.traffic.spans[0].t0

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "shape": self.shape,
            "load_s": round(self.load_s, 1),
            "latency_assumed": self.traffic.speed.basis,
            "from": self.measured.name if self.measured else None,
            "until_decided": self.anytime,
            "gates": [_gate_dict(g) for g in self.gates],
            "load_needed_s": _rounded(self.load_needed_s()),
            "notes": self.notes,
            "exit_code": self.exit_code,
        }


def _rounded(value: float | None) -> float | str | None:
    """A figure for JSON: rounded, and "inf" (as verdict.json writes it) for never."""
    if value is None:
        return None
    return "inf" if math.isinf(value) else round(value, 1)


def _gate_dict(g: GateNeed) -> dict[str, Any]:
    e = g.expected
    return {
        "id": g.gate,
        "key": g.key,
        "blocking": g.blocking,
        "line": g.line,
        "needed": g.needed,
        "expected": None if e.n is None else round(e.n, 1),
        "rate_s": _rounded(e.rate_s),
        "source": str(e.source),
        "basis": e.basis,
        "time_needed_s": _rounded(g.time_needed_s),
        "reach": str(g.reach),
        "not_applicable": g.not_applicable,
    }


def sample_plan(
    plan: Plan,
    gate_file: GateFile,
    measured: Measured | None = None,
    classes: Sequence[type[User]] | None = None,
) -> SamplePlan:
    """Every key or blocking gate of `gate_file` against the plan's load; `measured` (a
    previous run) replaces the model's counts where it can."""
    traffic = model(plan, classes)
    profile = target_profile(plan)
    given = profile.provides
    if isinstance(plan.target, VllmTarget) and plan.target.record_events:
        given |= RECORDER_GIVES
    anytime = plan.load.until == "decided"
    gates = []
    for gate in gate_file.gates:
        if not (gate.key or gate.blocking):
            continue
        guess = expected(traffic, gate)
        if measured is not None:
            guess = calibrated(guess, gate, traffic, measured)
        gates.append(
            GateNeed(
                gate.id,
                gate.key,
                gate.blocking,
                gate.pass_.text,
                needed(gate, anytime),
                guess,
                not_applicable(gate, given, profile),
            )
        )
    notes = list(traffic.notes)
    if measured is not None and measured.note:
        notes.append(f"{measured.name}: {measured.note}")
    return SamplePlan(
        plan.name, plan.load.shape, traffic.load_s, gates, traffic, measured, notes, anytime
    )


def _count(n: float | None) -> str:
    return "?" if n is None else f"{n:.0f}"


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return "never" if math.isinf(s) else f"{s:.0f} s"


def _reach_text(g: GateNeed, load_s: float) -> str:
    reach = g.reach
    if reach is Reach.SHORT:
        t = g.time_needed_s
        if t is None:  # a count the plan fixes: so many faults, so many phases
            return f"short by {_count((g.needed or 0) - (g.expected.n or 0))}"
        if not math.isinf(t):
            return f"short by {t - load_s:.0f} s"
        if g.expected.source is Source.MEASURED:
            return "short: the measured run had none"
        return "short: nothing it counts is sent"
    if reach is Reach.TIGHT:
        return "tight: enough only if the estimate holds"
    return str(reach)


def table(sp: SamplePlan) -> str:
    """The full table: key gates, then the other blocking gates, with footnotes."""
    lines = [
        f"sample plan for {sp.plan}: {_length(sp)} of load ({sp.shape})"
        + (f", measured by {sp.measured.name}" if sp.measured else "")
    ]
    if sp.anytime:
        lines.append(
            "load.until: decided: the load runs until each gate below is decided by its "
            "anytime-valid bound, so `needs` is that bound's, more than the verdict's fixed-n "
            "interval needs"
        )
    header = ("gate", "line", "needs", "expects", "time needed", "verdict")
    groups = (
        ("key gates (without their samples the run is INVALID)", [g for g in sp.gates if g.key]),
        (
            "blocking gates (their FAIL fails the run; without samples they are MARGINAL)",
            [g for g in sp.gates if not g.key],
        ),
    )
    for title, needs in groups:
        applied = [g for g in needs if g.reach is not Reach.NA]
        if not needs:
            continue
        lines.append(f"\n{title}:")
        rows = [header] + [
            (
                g.gate,
                g.line,
                _count(g.needed),
                f"{_count(g.expected.n)} ({MARK[g.expected.source]})",
                _seconds(g.time_needed_s),
                _reach_text(g, sp.load_s),
            )
            for g in applied
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
        for r in rows:
            cells = [r[i].rjust(w) if 2 <= i <= 4 else r[i].ljust(w) for i, w in enumerate(widths)]
            lines.append("  " + "  ".join(cells) + "  " + r[-1])
        lines += [f"  n/a: {g.gate}: {g.not_applicable}" for g in needs if g.reach is Reach.NA]
    lines.append("")
    lines += _footnotes(sp)
    lines.append(_summary(sp))
    return "\n".join(lines)


def _footnotes(sp: SamplePlan) -> list[str]:
    shown = [g for g in sp.gates if g.reach is not Reach.NA]
    used = {g.expected.source for g in shown}
    lines = []
    if Source.ASSUMED in used:
        lines.append(
            f"(a) assumed latencies, {sp.traffic.speed.basis}: a rough guess until a run "
            "measures them (--from RUN_DIR)"
        )
    if Source.MEASURED in used:
        lines.append("(m) measured: the gate's count in a previous run, per second of its load")
    if Source.PLAN in used:
        lines.append("(p) counted from the plan itself")
    for g in shown:
        lines.append(f"    {g.gate}: {g.expected.basis}")
    lines += [f"note: {n}" for n in sp.notes]
    return lines


def _length(sp: SamplePlan) -> str:
    return f"up to {sp.load_s:.0f} s" if sp.anytime else f"{sp.load_s:.0f} s"


def _summary(sp: SamplePlan) -> str:
    short = sp.short
    if short:
        needed = sp.load_needed_s()
        key = "load.max_duration_s" if sp.anytime else "load.duration_s"
        longer = (
            f"; at this mix the load needs about {math.ceil(needed)} s ({key})"
            if needed is not None
            else ""
        )
        names = ", ".join(g.gate for g in short)
        return (
            f"SHORT: {len(short)} key gate(s) will not get the samples a PASS needs ({names}): "
            f"a healthy run would read INVALID{longer}"
        )
    unknown = [g.gate for g in sp.key if g.reach is Reach.UNKNOWN]
    if unknown:
        return f"UNKNOWN: no estimate for key gate(s) {', '.join(unknown)}"
    return "ENOUGH: every key gate is expected to get the samples a PASS needs"


def compact(sp: SamplePlan) -> list[str]:
    """A few lines for `kvgate run` to print before the load: each key gate's need."""
    basis = "measured by " + sp.measured.name if sp.measured else "assumed latencies"
    lines = [f"samples a PASS needs in {_length(sp)} of load ({basis}):"]
    width = max((len(g.gate) for g in sp.key), default=0)
    for g in sp.key:
        text = f"  {g.gate.ljust(width)}  needs {_count(g.needed)}, expects {_count(g.expected.n)}"
        if g.reach in (Reach.SHORT, Reach.TIGHT, Reach.UNKNOWN):
            text += f": {_reach_text(g, sp.load_s)}"
        lines.append(text)
    lines.append(_summary(sp))
    return lines


class LoadTooShort(PlanError):
    """`kvgate run --strict` refuses a load too short for a key gate's samples."""


def announce(
    plan: Plan,
    gate_file: GateFile,
    classes: Sequence[type[User]],
    strict: bool,
    say: Callable[[str], None],
) -> SamplePlan:
    """`kvgate run`'s sample plan, said before anything starts: each key gate's need and
    what the load will give it, and a warning when a key gate will fall short. `strict`
    raises LoadTooShort instead of running such a load."""
    result = sample_plan(plan, gate_file, classes=classes)
    for line in compact(result):
        say(f"kvgate: {line}")
    if result.short and strict:
        raise LoadTooShort(
            "--strict: the load is too short for the samples a PASS needs; lengthen it "
            "(`kvgate plan check PLAN` gives the table), or run without --strict"
        )
    if result.short:
        say("kvgate: warning: running it anyway (--strict refuses such a load)")
    return result
