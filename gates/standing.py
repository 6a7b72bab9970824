"""A gate's standing while the load runs, by its anytime-valid bound (gates/sequential.py):
its decision, on how many observations, about how many it needs, and whether it is settled
for a load that runs until its gates are decided (`load.until: decided`); and the notes
a verdict gives on how such a load ended, from the record meta.json keeps of it.

The running check (harness/live/watch.py) computes a standing per gate it judges; the stop
rule (harness/live/until.py) reads the key and blocking gates' `settled` and `decision`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gates.sequential import ONE_WAY, Decided, decide, needs_n
from gates.spec import GateSpec

if TYPE_CHECKING:
    from gates.registry import Observations
    from gates.verdict import GateResult

# How a gate came to be settled: its bound decided it; its statistic is what the run
# observed (a count, a maximum), which more load cannot prove better; it does not apply.
BY_BOUND, BY_OBSERVATION, NOT_APPLICABLE = "anytime bound", "observed", "not applicable"


def standing(gate: GateSpec, obs: Observations | None) -> dict[str, Any]:
    """`decision` (PASS, FAIL, UNDECIDED, N/A) and `bound_text`; `n` (the records examined),
    `needs_n` (about how many a decision needs, None: out of reach), `settled` and
    `settled_by` (BY_BOUND, BY_OBSERVATION, NOT_APPLICABLE, or None while unsettled).

    A count, sum, max or min is bounded by what was observed so far, open on the side it can
    still move, so its bound decides a FAIL the moment the line is crossed and never a PASS
    before the end of the run: its value at the end is exactly what the run observed. For a
    load that runs until decided, such a gate is settled once it has its `min_samples` with
    nothing unsure and has not failed: more load would not make its pass surer, only give it
    more time to fail, which min_duration_s sets."""
    if obs is None:
        return {
            "decision": "N/A",
            "bound_text": "",
            "n": 0,
            "needs_n": None,
            "settled": True,
            "settled_by": NOT_APPLICABLE,
        }
    frame = obs.frame
    values = frame["value"].to_numpy(dtype=float)
    times = frame["t"].to_numpy(dtype=float) if "t" in frame else None
    alpha = 1 - gate.confidence
    unsure = len(obs.unsure)
    decision = decide(
        values,
        gate.pass_,
        alpha,
        t=times,
        examined=obs.n_samples,
        min_samples=gate.min_samples,
        unsure=unsure,
    )
    settled_by: str | None = BY_BOUND if decision.state != Decided.UNDECIDED else None
    stat = gate.pass_.statistic
    # a sum with negative values can still go either way: its bound is (-inf, inf)
    one_way = stat in ONE_WAY and not (decision.lo == -math.inf and decision.hi == math.inf)
    if one_way:
        needed: int | None = gate.min_samples if decision.state != Decided.FAIL else decision.n
        # a max or min of nothing is no data, as the verdict judges it; a count of none is 0
        seen = len(values) > 0 or stat in ("count", "sum")
        if settled_by is None and seen and decision.n >= gate.min_samples and not unsure:
            settled_by = BY_OBSERVATION
    elif settled_by is not None:
        needed = decision.n
    else:
        needed = needs_n(
            values, gate.pass_, alpha, t=times, min_samples=gate.min_samples, unsure=unsure
        )
        needed = _in_records(needed, len(values), obs.n_samples)
    bound = ""
    if not math.isnan(decision.lo):
        bound = f"[{_number(decision.lo)}, {_number(decision.hi)}] ({decision.method})"
    return {
        "decision": str(decision.state),
        "bound_text": bound,
        "n": decision.n,
        "needs_n": needed,
        "settled": settled_by is not None,
        "settled_by": settled_by,
    }


def _in_records(needed: int | None, observations: int, examined: int) -> int | None:
    """Observations needed, as records examined (a metric may examine more records than it
    keeps observations, at the ratio seen so far)."""
    if needed is None or observations == 0 or examined == observations:
        return needed
    return math.ceil(needed * examined / observations)


def _number(value: float) -> str:
    return ("inf" if value > 0 else "-inf") if math.isinf(value) else f"{value:.4g}"


def until_notes(meta: Mapping[str, Any], results: Sequence[GateResult]) -> list[str]:
    """What a verdict says of a `load.until: decided` load, from meta.json's `until`: why it
    stopped, and each gate that held it and was still undecided at its last look (a key gate,
    or a blocking gate with data), with the n it had and the n
    a decision needed (by the anytime bound; and by the fixed-n interval the verdict judges
    with, where that differs). Nothing for a load of fixed length."""
    record = meta.get("until")
    if not isinstance(record, dict):
        return []
    stopped = record.get("stopped_at_s")
    at = f"at +{float(stopped):.0f} s" if isinstance(stopped, int | float) else "(still running)"
    head = (
        f"load.until: decided: the load stopped {at} (min {_s(record.get('min_duration_s'))}, "
        f"max {_s(record.get('max_duration_s'))}): {record.get('stopped_because') or 'unknown'}"
    )
    gates = [g for g in record.get("gates") or [] if isinstance(g, dict)]
    waiting = [g for g in gates if not g.get("settled")]
    if record.get("decided") or not waiting:
        return [f"{head}; the verdict judges all that was collected, at fixed n"]
    fixed = {r.id: r.needs_n for r in results}
    looked = record.get("looked_at_s")
    when = f" at its last look (+{float(looked):.0f} s)" if isinstance(looked, int | float) else ""
    parts = [_waiting(g, fixed.get(str(g.get("id")))) for g in waiting]
    return [f"{head}; gates undecided{when}: {'; '.join(parts)}"]


def _waiting(gate: Mapping[str, Any], fixed_needs: int | None) -> str:
    needs = gate.get("needs_n")
    of = f" of about {needs} by the anytime bound" if isinstance(needs, int) else ""
    if not of:
        of = ", no number of them would decide it at the rate seen"
    text = f"{gate.get('id')} ({gate.get('decision')}, n {gate.get('n')}{of}"
    if fixed_needs is not None:
        text += f"; {fixed_needs} at fixed n"
    return text + ")"


def _s(value: Any) -> str:
    return f"{float(value):.0f} s" if isinstance(value, int | float) else "?"
