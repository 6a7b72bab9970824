"""A previous run as the measure of what a plan's gates will get (`--from RUN_DIR`).

Each gate is judged over that run as the verdict judges it, and the observations it
counted per second of that run's load are the expectation: the latencies, refusals and
preemptions of a real server, which no assumption knows. When the run's own plan (its
plan.json) still loads and the traffic model can count the gate on both plans, the count
is scaled by the model's ratio between them (more users, another mix, a longer load), so
the model's assumed latencies cancel out; otherwise it is scaled by the load's length.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gates.evaluator import judge
from gates.evidence import check_evidence
from gates.rundir import RunDirError, load_run
from gates.spec import GateFile, GateSpec
from gates.verdict import Status
from harness.plan import Plan, PlanError, plan_from_dict
from harness.sampleplan.expect import Expected, Source, expected
from harness.sampleplan.traffic import TrafficModel, model


class CalibrationError(ValueError):
    """The run directory cannot calibrate: the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Measured:
    """What a run's gates counted: observations per gate id (those that applied), over
    `load_s` seconds of load; its traffic as the model sees it, when its plan loads."""

    name: str
    load_s: float
    counts: dict[str, int]
    traffic: TrafficModel | None
    note: str | None = None


def measure(run_dir: Path, gate_file: GateFile) -> Measured:
    """Judge `gate_file`'s gates over the run in `run_dir`; CalibrationError when it has
    no load to measure by."""
    try:
        run = load_run(run_dir)
        check_evidence(run)
    except RunDirError as exc:
        raise CalibrationError(f"--from {run_dir}: {exc}") from None
    windows = run.meta.get("windows") or {}
    stress = windows.get("stress") if isinstance(windows, dict) else None
    if not stress or len(stress) != 2 or None in stress or stress[1] <= stress[0]:
        raise CalibrationError(
            f"--from {run_dir}: meta.json has no stress window, so nothing says how long its "
            "load ran; pass a run directory `kvgate run` wrote"
        )
    counts = {}
    for gate in gate_file.gates:
        result = judge(run, gate)
        if result.status != Status.NA:
            counts[gate.id] = result.n_samples
    traffic, note = _traffic(run_dir / "plan.json")
    # The stress window runs on while requests in flight at the load's end finish; the
    # load itself is the plan's, unless the run stopped it early.
    load_s = float(stress[1]) - float(stress[0])
    if traffic is not None:
        load_s = min(load_s, traffic.load_s)
    return Measured(run_dir.resolve().name, load_s, counts, traffic, note)


def _traffic(path: Path) -> tuple[TrafficModel | None, str | None]:
    if not path.is_file():
        return None, "its plan.json is missing, so the counts are scaled by the load's length"
    try:
        plan: Plan = plan_from_dict(json.loads(path.read_text(encoding="utf-8")), str(path))
        return model(plan), None
    except (PlanError, ValueError, OSError) as exc:
        first = str(exc).splitlines()[0]
        return None, f"its plan.json no longer loads ({first}); counts scaled by the load's length"


def calibrated(here: Expected, gate: GateSpec, traffic: TrafficModel, run: Measured) -> Expected:
    """The measured expectation of `gate` for the plan whose traffic is `traffic`, or the
    model's where the run cannot say (a count the plan fixes, a gate it did not judge)."""
    seen = run.counts.get(gate.id)
    if here.source is Source.PLAN or seen is None:
        return here
    there = expected(run.traffic, gate) if run.traffic is not None else None
    basis = f"{seen} in {run.load_s:.0f} s of {run.name}"
    if there is not None and there.n and here.n is not None:
        scale = here.n / there.n
        n = seen * scale
        basis += f", x{scale:.2f} for this plan's traffic" if abs(scale - 1) > 0.005 else ""
    else:
        n = seen / run.load_s * traffic.load_s
        basis += f", scaled to {traffic.load_s:.0f} s of load"
    rate = n / traffic.load_s if traffic.load_s > 0 else 0.0
    return Expected(n, rate, Source.MEASURED, basis)
