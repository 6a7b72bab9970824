"""Decision rules of the rollback comparison, and the likely cause.

ROLLBACK: the candidate fails a key gate the baseline passes, is much slower (large,
significant effect) for critical/interactive traffic or release, or newly fails (an
exact test, beyond the gate's own tolerance) on a rate a key gate bounds. HOLD: something
is off but rolling back is not clearly right (a run cannot judge, the evidence checks
distrust either run, the baseline fails too, small regressions, a rate a non-key gate
bounds, marginal gates); a baseline that cannot judge its timings still supports a
rollback from a candidate that fails a key gate no timing can fake (an OOM, a leak). Which
failures timing could fake, and which cause each failure points to, the gates' metrics
declare (gates/registry.py); no rule here names a metric.
"""

from __future__ import annotations

from typing import Any

from gates.evaluator import evaluate
from gates.evidence import EvidenceReport, check_evidence
from gates.rundir import RunData
from gates.spec import GateFile
from gates.terms import Cause
from gates.verdict import Status, Verdict, timing_could_fake
from reports import analysis
from reports.compare import (
    CAUSES,
    SMALL_EFFECT,
    WATERMARK_FLOOR,
    WATERMARK_STEP,
    Comparison,
    Decision,
    LatencyTest,
    adjust,
    gate_pairs,
    latency_tests,
    rejection_table,
    reservation_summary,
    usage_at_first_oom,
)
from reports.rates import RateTest, rate_tests

REJECTION_RISE = 0.02
UNDER_RESERVED_RISE = 0.02
MEDIAN_ERROR_SHIFT = 0.05
PRIORITY_GAP = 0.2  # effect gap between non-batch and batch TTFT that points at priority rules
MAX_REASONS = 8


def compare_runs(candidate: RunData, baseline: RunData, gate_file: GateFile) -> Comparison:
    """Judge both runs with the same gates and decide. Each run passes the evidence checks
    first (they may correct its tables, or raise EvidenceRefused), so every test below reads
    what its gates judged."""
    check_evidence(candidate)
    check_evidence(baseline)
    cand_verdict, base_verdict = evaluate(candidate, gate_file), evaluate(baseline, gate_file)
    gates = gate_pairs(cand_verdict, base_verdict)
    tests = latency_tests(candidate, baseline)
    rates = rate_tests(candidate, baseline, gate_file, gates)
    multiplicity = adjust(tests, rates)
    rejections = rejection_table(candidate, baseline)
    reservation = {
        "candidate": reservation_summary(candidate),
        "baseline": reservation_summary(baseline),
    }
    evidence = likely_causes(gates, tests, rejections, reservation)
    scores = {k: sum(points for points, _ in items) for k, items in evidence.items()}
    decision, reasons = rules(cand_verdict, base_verdict, gates, tests, rates)
    ranked = sorted((k for k in scores if scores[k] > 0), key=lambda k: -scores[k])
    watermark, why = (None, "")
    # an admission watermark is a knob only of a scheduler whose profile declares one
    if decision == Decision.ROLLBACK and "admission_watermark" in candidate.profile.watermarks:
        watermark, why = recommend_watermark(candidate, baseline)
    target = baseline.meta.get("target") or {}
    return Comparison(
        decision=decision,
        reasons=reasons,
        likely_cause=CAUSES[ranked[0]] if ranked and decision != Decision.PROMOTE else None,
        causes={k: [text for _, text in items] for k, items in evidence.items()},
        cause_scores=scores,
        rollback_to=target.get("scheduler_config_digest")
        if decision == Decision.ROLLBACK
        else None,
        recommended_admission_watermark=watermark,
        watermark_reason=why,
        candidate=_summary(candidate, cand_verdict),
        baseline=_summary(baseline, base_verdict),
        gates=gates,
        latency=tests,
        rates=rates,
        multiplicity=multiplicity,
        rejections=rejections,
        reservation=reservation,
    )


def rules(
    cand: Verdict,
    base: Verdict,
    gates: list[dict[str, Any]],
    tests: list[LatencyTest],
    rates: list[RateTest],
) -> tuple[Decision, list[str]]:
    untrusted = bool(cand.run_problems)
    key_fail = [
        g
        for g in gates
        if g["key"] and g["candidate"] == Status.FAIL and not (untrusted and _timing_could_fake(g))
    ]
    new_fail = [g for g in key_fail if g["baseline"] != Status.FAIL]
    shared_fail = [g for g in key_fail if g["baseline"] == Status.FAIL]
    large = [
        t
        for t in tests
        if t.large_regression and (t.metric == "cancel_release" or "/batch" not in t.group)
    ]
    small = [t for t in tests if t.regression and t not in large]
    # A failure is no timing (gates/verdict.py): a candidate that newly fails on a rate a key
    # gate bounds rolls back whatever its timings; one a lesser gate bounds holds.
    worse = sorted((r for r in rates if r.worse), key=lambda r: not r.key)
    reasons = [
        f"candidate fails key gate {g['id']} ({_value(g, 'candidate')}) which the baseline passes"
        for g in new_fail
    ]
    reasons += [
        f"{t.metric} {t.group} is slower: median {t.median_candidate:.3g}s "
        f"vs {t.median_baseline:.3g}s, effect {t.effect:+.2f}, p={t.p_value:.2g} "
        f"(Holm {t.p_adjusted:.2g})"
        for t in sorted(large, key=lambda t: -t.effect)[:MAX_REASONS]
    ]
    if len(large) > MAX_REASONS:
        reasons.append(
            f"... and {len(large) - MAX_REASONS} more significantly slower class/priority groups"
        )
    reasons += [f"candidate fails more often: {r.text()}" for r in worse]
    distrusted = {"candidate": _evidence_problems(cand), "baseline": _evidence_problems(base)}
    reasons += [
        f"the evidence checks distrust the {side} run: {problem}"
        for side, problems in distrusted.items()
        for problem in problems
    ]
    if base.status == Status.INVALID:
        why = _why_invalid(base, distrusted["baseline"])
        # A breach no timing can fake (an OOM, a tenant over its cap, a leak) in the candidate,
        # on a key gate the baseline passed, still rolls back: the baseline's doubts are about
        # its timings or its evidence elsewhere, and its run without that breach is real.
        hard = [g for g in new_fail if not _timing_could_fake(g) and g["baseline"] == Status.PASS]
        if hard:
            return Decision.ROLLBACK, [
                *reasons,
                f"the baseline run is INVALID ({why}), but it passed "
                f"{', '.join(g['id'] for g in hard)}, which no timing can fake",
            ]
        return Decision.HOLD, [*reasons, f"the baseline run is INVALID: {why}"]
    if new_fail or (large and not untrusted) or any(r.key for r in worse):
        return Decision.ROLLBACK, reasons
    reasons += [
        f"both runs fail key gate {g['id']}: rolling back would not fix it" for g in shared_fail
    ]
    reasons += [
        f"small regression: {t.metric} {t.group} effect {t.effect:+.2f} "
        f"(p={t.p_value:.2g}, Holm {t.p_adjusted:.2g})"
        for t in small
    ]
    if cand.status != Status.PASS:
        rest = [p for p in cand.run_problems if p not in distrusted["candidate"]]
        reasons.append(
            f"candidate verdict is {cand.status}" + (": " + "; ".join(rest) if rest else "")
        )
    if reasons:
        return Decision.HOLD, reasons
    return Decision.PROMOTE, [
        "every gate passes, and no latency distribution or failure rate is significantly worse"
    ]


def _evidence_problems(verdict: Verdict) -> list[str]:
    """The evidence checks' findings that make `verdict`'s run untrustworthy (gates/evidence)."""
    return EvidenceReport.from_dict(verdict.evidence).problems


def _why_invalid(verdict: Verdict, shown: list[str]) -> str:
    """Why a run is INVALID, leaving out the evidence problems already given as reasons."""
    rest = [p for p in verdict.run_problems if p not in shown]
    if rest:
        return "; ".join(rest)
    return "its evidence, as above" if shown else "key gates without data"


def likely_causes(
    gates: list[dict[str, Any]],
    tests: list[LatencyTest],
    rejections: list[dict[str, Any]],
    reservation: dict[str, dict[str, float | None]],
) -> dict[str, list[tuple[int, str]]]:
    """Weighted evidence for each cause; the cause with the highest total is named.

    A slowdown every priority shares is not blamed on priority rules: only a gap between
    high-priority and batch effects is.
    """
    # A gate the candidate could not judge (its replicas died, say) is no evidence of a cause;
    # a metric judged by several gates is one piece of evidence.
    new_fail = {
        g["metric"]: g
        for g in gates
        if g["candidate"] in (Status.FAIL, Status.MARGINAL) and g["baseline"] == Status.PASS
    }
    causes: dict[str, list[tuple[int, str]]] = {k: [] for k in CAUSES}
    causes[Cause.ESTIMATION_BIAS] += _estimation_evidence(reservation)
    risen = [
        r
        for r in rejections
        if r["reason"] == "all" and r["priority"] != "batch" and r["change"] > REJECTION_RISE
    ]
    if risen:
        text = ", ".join(
            f"{r['priority']} {r['rate_baseline']:.1%} -> {r['rate_candidate']:.1%}" for r in risen
        )
        causes[Cause.PRIORITY_RULES].append((2, f"rejection rate rose for {text}"))
    ttft = [t for t in tests if t.metric == "ttft"]
    high = [t.effect for t in ttft if "/batch" not in t.group]
    low = [t.effect for t in ttft if "/batch" in t.group]
    if high and max(high) >= SMALL_EFFECT and max(high) - (max(low) if low else 0.0) > PRIORITY_GAP:
        causes[Cause.PRIORITY_RULES].append(
            (2, f"TTFT of non-batch traffic slower than batch's (effect up to {max(high):+.2f})")
        )
    release = [t for t in tests if t.metric == "cancel_release" and t.regression]
    if release:
        worst = max(release, key=lambda t: t.effect)
        medians = f"{worst.median_candidate:.3g}s vs {worst.median_baseline:.3g}s"
        causes[Cause.RELEASE_DEFECT].append((2, f"cancel-to-release slower: median {medians}"))
    for g in new_fail.values():
        cause = Cause(g["cause"])
        if cause is not Cause.NONE:
            causes[cause].append(
                (
                    int(g["cause_weight"]),
                    f"gate {g['id']} {g['candidate']} ({_value(g, 'candidate')})",
                )
            )
    return causes


def _timing_could_fake(gate: dict[str, Any]) -> bool:
    """Whether the candidate's value of this gate is one untrusted timings could explain."""
    return timing_could_fake(bool(gate["timing"]), gate["candidate_value"])


def _estimation_evidence(reservation: dict[str, dict[str, float | None]]) -> list[tuple[int, str]]:
    cand, base = reservation["candidate"], reservation["baseline"]
    found: list[tuple[int, str]] = []
    under_c, under_b = cand["under_reserved"], base["under_reserved"]
    if under_c is not None and under_b is not None and under_c - under_b > UNDER_RESERVED_RISE:
        found.append((2, f"requests using more than reserved: {under_b:.1%} -> {under_c:.1%}"))
    median_c, median_b = cand["median_error"], base["median_error"]
    if (
        median_c is not None
        and median_b is not None
        and abs(median_c - median_b) > MEDIAN_ERROR_SHIFT
    ):
        found.append((1, f"median reservation error {median_b:+.2f} -> {median_c:+.2f}"))
    return found


def recommend_watermark(candidate: RunData, baseline: RunData) -> tuple[float, str]:
    """A global admission watermark below both configs' (and below where the candidate OOMed)."""
    default = analysis.DEFAULT_WATERMARKS["admission_watermark"]
    cand = float(analysis.scheduler_config(candidate).get("admission_watermark", default))
    base = float(analysis.scheduler_config(baseline).get("admission_watermark", default))
    lower = min(cand, base)
    value = lower - WATERMARK_STEP
    why = f"{WATERMARK_STEP:g} below the lower admission watermark of the two configs ({lower:g})"
    at_oom = usage_at_first_oom(candidate)
    if at_oom is not None and at_oom - 2 * WATERMARK_STEP < value:
        value = at_oom - 2 * WATERMARK_STEP
        why = f"{2 * WATERMARK_STEP:g} below the pool usage the candidate OOMed at ({at_oom:.2f})"
    value = round(max(WATERMARK_FLOOR, value), 2)
    return value, why + (f"; floored at {WATERMARK_FLOOR:g}" if value == WATERMARK_FLOOR else "")


def _value(gate: dict[str, Any], side: str) -> str:
    value = gate[f"{side}_value"]
    return f"{value:.4g} vs {gate['threshold']}" if value is not None else "no data"


def _summary(run: RunData, verdict: Verdict) -> dict[str, Any]:
    target = run.meta.get("target") or {}
    evidence = EvidenceReport.from_dict(verdict.evidence)
    return {
        "path": str(run.path),
        "verdict": str(verdict.status),
        "run_problems": verdict.run_problems,
        "policy": target.get("policy"),
        "scheduler_config_digest": target.get("scheduler_config_digest"),
        "admission_watermark": analysis.scheduler_config(run).get("admission_watermark"),
        "requests": len(run.requests),
        "evidence": {"problems": evidence.problems, "notes": evidence.notes},
    }
