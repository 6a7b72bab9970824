"""The gate evaluator: metrics -> statistic with its interval -> per-gate status -> verdict.

Each gate reads its observations with confidence (gates/estimate.py): PASS only when the
interval's pessimistic end meets the line, FAIL when the point value breaks it, otherwise
MARGINAL (INVALID for a key gate) with the samples a conclusive judgement would need.

The run's verdict, in this order (gates/README.md says the same):
1. FAIL when a blocking gate (one whose gate file gives the reason it blocks, `blocks:
   "..."`: the seed's release criteria and the security rules; its FAIL's message says the
   reason) has failed in a way nothing else about the run can undo: a breach of a metric
   that is not a timing metric, as its registration declares (an OOM, a tenant over its
   cap), or a timing metric whose whole interval lies past the line, by more than the
   run's timings can be late: a lagging simulator by its worst measured lag; a load
   generator over its CPU budget by an unknown amount, so there only a timing of +inf
   still counts (requests never answered, releases that never came: a busy machine makes
   things slow, it does not make them vanish; gates.verdict's `timing_could_fake`). More
   evidence elsewhere, or for a key gate that has too little, would not change that.
2. INVALID when the run cannot be trusted: an evidence check says so (gates/evidence: the
   records are duplicated, clocks disagree beyond a bound, the run did not finish, ...), the
   load generator hit its CPU warning, the
   simulator lagged beyond its bound, a fault's rollback did not finish (the server may have
   been left down), no gate could judge at all, or a key gate has no data or too little
   evidence.
3. FAIL when any blocking gate fails, or the weighted score of the judged gates is below
   the file's floor.
4. MARGINAL when any gate is not PASS; else PASS.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gates import schema
from gates.applicability import not_applicable
from gates.estimate import Estimate, Reading, estimate, needs_n, read
from gates.evidence import check_evidence
from gates.junit import write_junit
from gates.metrics import REGISTRY, MetricDef, Observations
from gates.rundir import RunData, load_run
from gates.spec import GateFile, GateSpec, load_gate_file
from gates.standing import until_notes
from gates.terms import OPERATORS, Threshold
from gates.verdict import SCORE, GateResult, Status, Verdict

EVIDENCE_ROWS = 5
NO_DATA = Estimate(math.nan, math.nan, math.nan, 0, "")
MISSING_STATUS = {"invalid": Status.INVALID, "fail": Status.FAIL, "pass": Status.PASS}


def evaluate(run: RunData, gate_file: GateFile, gates_path: str = "builtin") -> Verdict:
    """Judge every gate of `gate_file` over `run`, after the evidence checks (which may
    correct the run's tables, or raise EvidenceRefused); writes nothing."""
    evidence = check_evidence(run)
    results = [judge(run, gate) for gate in gate_file.gates]
    timing = run_problems(run.meta)
    problems = [*timing, *rollback_problems(run.faults), *evidence.problems]
    applied = [g for g in results if g.status != Status.NA]
    # The score is over the gates that could judge: a gate without data is not a failure
    # (it makes the run INVALID when key, MARGINAL otherwise), so it must not drag the run
    # below the floor either. N/A gates are out of the verdict altogether.
    judged = [g for g in applied if g.status != Status.INVALID]
    total_weight = sum(g.weight for g in judged)
    score = sum(SCORE[g.status] * g.weight for g in judged) / total_weight if judged else 0.0
    unjudged_key = [g.id for g in results if g.key and g.status == Status.INVALID]
    if unjudged_key:
        problems = [*problems, f"key gates without enough evidence: {', '.join(unjudged_key)}"]
    if not judged:
        problems = [*problems, "no gate had data to judge"]
    slack = _timing_slack_s(run.meta) if timing else 0.0
    if evidence.doubts_timing:
        slack = math.inf
    if any(_fails_for_good(g, slack) for g in results):
        status = Status.FAIL
    elif problems:
        status = Status.INVALID
    elif (
        any(g.blocks and g.status == Status.FAIL for g in results)
        or score < gate_file.fail_score_below
    ):
        status = Status.FAIL
    elif any(g.status != Status.PASS for g in applied):
        status = Status.MARGINAL
    else:
        status = Status.PASS
    notes = [
        f"{name}.jsonl: dropped {n} truncated line(s)" for name, n in run.truncated_lines.items()
    ]
    notes.extend(evidence.notes)
    if run.profile_note:
        notes.append(run.profile_note)
    notes.extend(until_notes(run.meta, results))  # load.until: decided: how the load ended
    aborted = run.meta.get("aborted")
    if isinstance(aborted, dict) and aborted.get("gate"):
        # a gate with abort_on_fail stopped the load: whatever the rest says, the run FAILs
        status = Status.FAIL
        notes.insert(
            0,
            f"aborted at +{float(aborted.get('at_s') or 0):.0f} s by gate {aborted['gate']}: "
            f"{aborted.get('message', '')}",
        )
    return Verdict(
        status=status,
        gates=results,
        run_problems=problems,
        score=round(score, 4),
        run_dir=str(run.path),
        gates_file=gates_path,
        notes=notes,
        fail_score_below=gate_file.fail_score_below,
        profile={"kind": run.profile.kind, "source": run.profile_source},
        evidence=evidence.to_dict(),
    )


def _fails_for_good(gate: GateResult, slack_s: float) -> bool:
    """A blocking gate's FAIL that no more evidence, and no doubt about the run's timings,
    could turn into a PASS (rule 1 of the verdict). `slack_s`: how late the run's timings
    may be (0 when they are trusted, +inf when nobody can say)."""
    if not gate.blocks or gate.status != Status.FAIL:
        return False
    if not gate.timing_could_fake():
        return True  # not a timing, or censored: answers or releases that never came
    if gate.straddles or gate.interval is None:
        return False
    # the whole interval is past the line, by more than the timings could be late
    line = Threshold.model_validate(gate.threshold).value
    return bool(gate.interval[0] - line > slack_s)


def _timing_slack_s(meta: dict[str, Any]) -> float:
    """How late a run's timings can be, when something made them doubtful: a lagging
    simulator was at most its worst measured step lag late (every release and token it
    produced came that much late at most); a load generator over its CPU budget stamped its
    requests late by an amount nobody measured (+inf)."""
    if meta.get("cpu_warning"):
        return math.inf
    worst = meta.get("sim_lag_ms_max") or meta.get("sim_lag_ms_p99")
    return float(worst) / 1000.0 if isinstance(worst, int | float) else math.inf


def rollback_problems(faults: pd.DataFrame) -> list[str]:
    """Faults whose rollback did not finish: the server may have been left down (or paused,
    or degraded) for the rest of the run, so what followed says nothing about it."""
    if faults.empty or "outcome" not in faults:
        return []
    # a fault's outcome is "failed: " + its problems joined by "; " (harness/faults/base.py)
    problems = faults["outcome"].astype(str).str.removeprefix("failed: ").str.split("; ")
    broken = faults[problems.map(lambda ps: any(p.startswith("rollback") for p in ps))]
    return [
        f"fault {row.kind} on {row.target} did not finish its rollback ({row.outcome}): "
        "the server may have been left down; bring it back before the next run"
        for row in broken.itertuples()
    ]


def run_problems(meta: dict[str, Any]) -> list[str]:
    """Why the run cannot judge the system at all (load generator or simulator untrustworthy)."""
    problems = []
    if meta.get("cpu_warning"):
        warnings = meta.get("cpu_warnings") or []
        first = warnings[0] if warnings and isinstance(warnings[0], dict) else {}
        where = (
            f"; first: worker {first.get('worker')} at {first.get('cpu_percent')}% CPU"
            if first
            else ""
        )
        problems.append(
            f"the load generator hit its CPU warning ({len(warnings)} warning(s){where}); "
            "its timings are not trustworthy: add workers or lower the user count"
        )
    lag, bound = meta.get("sim_lag_ms_p99"), meta.get("sim_lag_bound_ms")
    if isinstance(lag, int | float) and isinstance(bound, int | float) and lag > bound:
        problems.append(
            f"the simulated GPU lagged its clock (p99 {lag:g} ms > bound {bound:g} ms); "
            "rerun on a less loaded machine or with fewer replicas"
        )
    return problems


def judge(run: RunData, gate: GateSpec) -> GateResult:
    """The gate's result over `run`; a FAIL that blocks the release says why."""
    return judge_observed(run, gate)[0]


def judge_observed(run: RunData, gate: GateSpec) -> tuple[GateResult, Observations | None]:
    """`judge`, with the observations it judged (None when the gate is N/A), for a reader
    that judges them again another way (the running check's anytime-valid bounds)."""
    result, obs = _judged(run, gate)
    if result.status == Status.FAIL and result.blocks_because:
        result.message += f"; blocks the release: {result.blocks_because}"
    return result, obs


def _judged(run: RunData, gate: GateSpec) -> tuple[GateResult, Observations | None]:
    definition = REGISTRY[gate.metric]
    why_not = f"left out by the gate file: {gate.skip}" if gate.skip else None
    why_not = why_not or not_applicable(run, gate.needs)
    if why_not is not None:
        result = _unjudged(gate, definition)
        result.status, result.message = Status.NA, f"N/A: {why_not}"
        return result, None
    try:
        obs = definition.compute(run, gate.filter, gate.params)
    except (KeyError, ValueError, TypeError) as exc:
        obs = Observations.none(
            f"metric {gate.metric} could not be computed: {type(exc).__name__}: {exc}"
        )
    values = obs.frame["value"].to_numpy(dtype=float)
    # No examined record is no data, even for a count (zero violations of nothing).
    times = obs.frame["t"].to_numpy(dtype=float) if "t" in obs.frame else None
    est = estimate(values, gate.pass_, gate.confidence, times) if obs.n_samples else NO_DATA
    result = _unjudged(gate, definition)
    result.value = None if math.isnan(est.value) else est.value
    result.n_samples = obs.n_samples
    result.notes = list(obs.notes)
    result.method = est.method
    result.censored = int(np.isinf(values).sum())
    if math.isnan(est.value):
        why = obs.missing or f"no observation to take {gate.pass_.label} of"
        result.status = MISSING_STATUS[gate.on_missing]
        result.message = f"no data: {why}"
        return result, obs
    if est.method != "exact":
        result.interval = [est.lo, est.hi]
    _attach_evidence(result, obs.frame, gate.pass_)
    reading, result.straddles = read(
        est, gate.pass_, gate.min_samples, obs.n_samples, len(obs.unsure)
    )
    shown = result.value_text()
    if reading is Reading.BREACH:
        result.status = Status.FAIL
        result.message = f"{shown}: breaks {gate.pass_.text}"
        if result.straddles:
            result.message += f" (the {gate.confidence:.0%} interval straddles the line)"
    elif reading is Reading.UNPROVEN:
        result.status = Status.INVALID if gate.key else Status.MARGINAL
        result.needs_n = needs_n(
            values, est, gate.pass_, gate.min_samples, obs.n_samples, gate.confidence
        )
        result.message = f"{shown}: meets {gate.pass_.text} but {_why_unproven(result, obs)}"
    elif gate.warn is not None and not gate.warn.holds(est.value):
        result.status = Status.MARGINAL
        result.message = f"{shown}: meets {gate.pass_.text} but not {gate.warn.text}"
    else:
        result.message = f"{shown}: meets {gate.pass_.text}"
    return result, obs


def _unjudged(gate: GateSpec, definition: MetricDef) -> GateResult:
    """The gate's result before anything is judged: what it is, no value, PASS pending."""
    return GateResult(
        id=gate.id,
        title=gate.title,
        metric=gate.metric,
        key=gate.key,
        blocks=gate.blocking,
        blocks_because=gate.blocks_because,
        weight=gate.weight,
        status=Status.PASS,
        statistic=gate.pass_.label,
        threshold=gate.pass_.text,
        warn=gate.warn.text if gate.warn else None,
        value=None,
        n_samples=0,
        message="",
        filter=gate.filter.model_dump(exclude_none=True),
        timing=definition.timing,
        cause=definition.cause,
        cause_weight=definition.cause_weight,
        unit=definition.unit,
        confidence=gate.confidence,
        spec=gate.resolved(definition.params),
    )


def _why_unproven(result: GateResult, obs: Observations) -> str:
    """Why a value that meets its line is not yet evidence that it does."""
    reasons = []
    if result.straddles:
        reasons.append(f"its {result.confidence:.0%} interval straddles the line")
    if obs.unsure:
        reasons.append(f"{len(obs.unsure)} observation(s) could go either way: {obs.unsure[0]}")
    if result.needs_n is not None:
        reasons.append(f"needs >= {result.needs_n} samples (has {result.n_samples})")
    elif result.straddles:
        reasons.append("more samples at the observed value would not settle it")
    return "; ".join(reasons) or "the evidence is too thin"


def _attach_evidence(result: GateResult, frame: pd.DataFrame, threshold: Threshold) -> None:
    """The worst rows, and when/how often single observations broke the threshold."""
    if frame.empty:
        return
    values = frame["value"].to_numpy(dtype=float)
    breach = ~np.asarray(OPERATORS[threshold.op](values, threshold.value), dtype=bool)
    if threshold.statistic in ("count", "sum"):
        breach = np.ones(len(frame), dtype=bool)
    result.breaches = int(breach.sum())
    if "t" in frame.columns and result.breaches:
        first = frame.loc[breach, "t"].min()
        result.first_breach_t = None if pd.isna(first) else float(first)
    pick = frame.nlargest if threshold.higher_is_worse else frame.nsmallest
    worst = pick(EVIDENCE_ROWS * 100, "value")
    worst = worst[~_subject(worst).duplicated()].head(EVIDENCE_ROWS)
    columns = [
        c for c in ("request_id", "t", "tenant", "replica", "value", "detail") if c in worst.columns
    ]
    shown = worst[columns]
    # a categorical's few rows as text first: as objects, pandas would convert every one of
    # its categories (a request id has one per request of the run)
    text = {c: str for c in columns if isinstance(shown[c].dtype, pd.CategoricalDtype)}
    records = shown.astype(text).astype(object).where(shown.notna(), None).to_dict("records")
    result.evidence = [{k: v for k, v in row.items() if v is not None} for row in records]


def _subject(rows: pd.DataFrame) -> pd.Series:
    """Who a row is about (a request, else a tenant on a replica, else itself): evidence names
    distinct culprits rather than five samples of the same one."""
    key = pd.Series(rows.index.astype(str), index=rows.index)
    if "tenant" in rows.columns:
        tenant = (
            rows["tenant"].astype(str)
            + "@"
            + rows.get("replica", pd.Series("", index=rows.index)).astype(str)
        )
        key = key.where(rows["tenant"].isna(), tenant)
    if "request_id" in rows.columns:
        key = key.where(rows["request_id"].isna(), rows["request_id"].astype(str))
    return key


def evaluate_run(
    run_dir: Path,
    gates_file: Path | None = None,
    run: RunData | None = None,
    current_profiles: bool = False,
) -> Verdict:
    """Load, judge and write verdict.json and junit.xml into `run_dir`; returns the verdict.
    `current_profiles`: judge by today's profile files, not the run's snapshot (load_run)."""
    gate_file = load_gate_file(gates_file)
    data = run if run is not None else load_run(run_dir, current_profiles=current_profiles)
    verdict = evaluate(data, gate_file, str(gates_file) if gates_file else "builtin")
    write_verdict(verdict, Path(run_dir))
    return verdict


def write_verdict(verdict: Verdict, run_dir: Path) -> None:
    (run_dir / schema.VERDICT_FILE).write_text(json.dumps(verdict.to_dict(), indent=2) + "\n")
    write_junit(verdict, run_dir / schema.JUNIT_FILE)
