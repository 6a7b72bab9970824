"""The rollback decision: a candidate run against a baseline run.

Per gate both verdicts; per traffic class and priority a Mann-Whitney U test with the
rank-biserial effect size (positive: the candidate is slower) on TTFT, end-to-end and
cancel-to-release latency, a request never answered counted +inf as the gates count it;
per failure rate a gate bounds, an exact one-sided test (reports/rates.py); every p value
adjusted by Holm over all of them; rejection rates; reservation error. The decision is
PROMOTE, HOLD (a human decides) or ROLLBACK to the baseline's scheduler config digest with
a lower global admission watermark, and names the likely cause.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu

from contract import EventKind
from contract.enums import DEATH_EVENTS
from gates.categories import per_category
from gates.metrics_requests import latencies
from gates.rundir import RunData
from gates.stats import percentile
from gates.terms import Cause
from gates.verdict import Verdict, _clean
from reports import analysis
from reports.rates import RateTest
from reports.significance import ALPHA, holm

MAX_SAMPLES = 20_000  # per side; a rank test on more adds nothing but time
MIN_SAMPLES = 20
MULTIPLICITY = "holm"
SMALL_EFFECT, LARGE_EFFECT = 0.1, 0.3
WATERMARK_STEP, WATERMARK_FLOOR = 0.05, 0.5


class Decision(StrEnum):
    PROMOTE = "PROMOTE"
    HOLD = "HOLD"
    ROLLBACK = "ROLLBACK"


EXIT_CODES = {Decision.PROMOTE: 0, Decision.HOLD: 4, Decision.ROLLBACK: 3}
# The causes a rollback can name: those a metric can declare (gates/terms.py), NONE aside.
CAUSES: dict[str, str] = {c.value: c.description for c in Cause if c is not Cause.NONE}


@dataclass(slots=True)
class LatencyTest:
    metric: str
    group: str
    n_candidate: int
    n_baseline: int
    median_candidate: float
    median_baseline: float
    p_value: float
    effect: float  # rank-biserial: P(candidate > baseline) - P(candidate < baseline)
    p_adjusted: float = math.nan  # Holm's, over every test of the comparison (`adjust`)

    @property
    def regression(self) -> bool:
        return self.p_adjusted < ALPHA and self.effect >= SMALL_EFFECT

    @property
    def large_regression(self) -> bool:
        return self.p_adjusted < ALPHA and self.effect >= LARGE_EFFECT


@dataclass(slots=True)
class Comparison:
    decision: Decision
    reasons: list[str]
    likely_cause: str | None
    causes: dict[str, list[str]]
    cause_scores: dict[str, int]
    rollback_to: str | None
    recommended_admission_watermark: float | None
    watermark_reason: str
    candidate: dict[str, Any]
    baseline: dict[str, Any]
    gates: list[dict[str, Any]]
    latency: list[LatencyTest]
    rates: list[RateTest]
    # how the p values were adjusted: method, the number of tests in the family, alpha
    multiplicity: dict[str, Any]
    rejections: list[dict[str, Any]]
    reservation: dict[str, dict[str, float | None]]
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.decision]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["latency"] = [
            {**asdict(t), "regression": t.regression, "large_regression": t.large_regression}
            for t in self.latency
        ]
        data["rates"] = [r.to_dict() for r in self.rates]
        data["exit_code"] = self.exit_code
        return dict(_clean(data))


def rank_test(candidate: np.ndarray, baseline: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """(p value, rank-biserial effect) of a two-sided Mann-Whitney U test, samples capped."""
    rng = np.random.default_rng(seed)
    if len(candidate) > MAX_SAMPLES:
        candidate = rng.choice(candidate, MAX_SAMPLES, replace=False)
    if len(baseline) > MAX_SAMPLES:
        baseline = rng.choice(baseline, MAX_SAMPLES, replace=False)
    result = mannwhitneyu(candidate, baseline, alternative="two-sided")
    effect = 2.0 * float(result.statistic) / (len(candidate) * len(baseline)) - 1.0
    return float(result.pvalue), effect


def latency_tests(candidate: RunData, baseline: RunData) -> list[LatencyTest]:
    tests = []
    for metric, cand, base in (
        ("ttft", _request_groups(candidate, "ttft_s"), _request_groups(baseline, "ttft_s")),
        ("e2e", _request_groups(candidate, "e2e_s"), _request_groups(baseline, "e2e_s")),
        ("cancel_release", _release_groups(candidate), _release_groups(baseline)),
    ):
        for group in sorted(set(cand) & set(base)):
            a, b = cand[group], base[group]
            if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
                continue
            p_value, effect = rank_test(a, b)
            tests.append(
                LatencyTest(
                    metric,
                    group,
                    len(a),
                    len(b),
                    percentile(a, 50),
                    percentile(b, 50),
                    p_value,
                    effect,
                )
            )
    return tests


def adjust(latency: list[LatencyTest], rates: list[RateTest]) -> dict[str, Any]:
    """Set every test's Holm-adjusted p value, the family being every latency test and every
    rate that can differ (`RateTest.in_family`; one that cannot is left at 1)."""
    family: list[LatencyTest | RateTest] = [*latency, *(r for r in rates if r.in_family)]
    for test, adjusted in zip(family, holm([t.p_value for t in family]), strict=True):
        test.p_adjusted = adjusted
    for r in rates:
        if not r.in_family:
            r.p_adjusted = 1.0
    return {"method": MULTIPLICITY, "tests": len(family), "alpha": ALPHA}


def _request_groups(run: RunData, column: str) -> dict[str, np.ndarray]:
    """Per class/priority, each request's latency as the latency gates judge it: a request
    the server never answered is +inf, not dropped (gates.metrics_requests.latencies)."""
    value = latencies(run.requests, column)
    rows = run.requests[value.notna()]
    group = rows["traffic_class"].astype(str) + "/" + rows["priority"].astype(str)
    return {str(k): v.to_numpy(dtype=float) for k, v in value[value.notna()].groupby(group)}


def _release_groups(run: RunData) -> dict[str, np.ndarray]:
    frame = analysis.release_latencies(run)
    if frame.empty or "detail" not in frame.columns:
        return {}
    frame = frame[~frame["detail"].astype(str).str.startswith(("never", "histogram"))]
    groups = {str(k): v.to_numpy(dtype=float) for k, v in frame["value"].groupby(frame["detail"])}
    groups["all"] = analysis.release_latencies(run)["value"].to_numpy(dtype=float)
    return groups


def reservation_summary(run: RunData) -> dict[str, float | None]:
    errors = analysis.reservation_error(run)
    if errors.empty:
        return {"n": 0, "median_error": None, "p95_error": None, "under_reserved": None}
    e = errors["error"].to_numpy(dtype=float)
    return {
        "n": len(e),
        "median_error": percentile(e, 50),
        "p95_error": percentile(e, 95),
        "under_reserved": float(np.mean(e > 0)),
    }


def rejection_table(candidate: RunData, baseline: RunData) -> list[dict[str, Any]]:
    cand = analysis.rejection_rates(candidate).set_index(["priority", "reason"])
    base = analysis.rejection_rates(baseline).set_index(["priority", "reason"])
    joined = pd.concat(
        [cand["rate"].rename("rate_candidate"), base["rate"].rename("rate_baseline")], axis=1
    ).fillna(0.0)
    joined["change"] = joined["rate_candidate"] - joined["rate_baseline"]
    return [
        {"priority": str(p), "reason": str(r), **{k: float(v) for k, v in row.items()}}
        for (p, r), row in joined.iterrows()
    ]


def gate_pairs(candidate: Verdict, baseline: Verdict) -> list[dict[str, Any]]:
    base = {g.id: g for g in baseline.gates}
    rows = []
    for g in candidate.gates:
        b = base.get(g.id)
        rows.append(
            {
                "id": g.id,
                "title": g.title,
                "key": g.key,
                "metric": g.metric,
                "timing": g.timing,
                "cause": g.cause,
                "cause_weight": g.cause_weight,
                "threshold": g.threshold,
                "candidate": str(g.status),
                "candidate_value": g.value,
                "baseline": str(b.status) if b else None,
                "baseline_value": b.value if b else None,
            }
        )
    return rows


def usage_at_first_oom(run: RunData) -> float | None:
    """Pool usage ratio just before the first OOM, from server events, when the run OOMed."""
    ev = run.server_events
    ooms = ev[
        ev["event"].eq(EventKind.OOM)
        | (
            ev["event"].eq(EventKind.REPLICA_DIED)
            & per_category(
                ev["reason"], lambda r: r.astype(str).str.contains("(?i)oom|out of memory")
            )
        )
    ]
    if ooms.empty:
        return None
    first = ooms.sort_values("t").iloc[0]
    before = ev[
        ev["replica"].eq(first["replica"]) & ev["t"].le(first["t"]) & ev["pool_total_blocks"].gt(0)
    ]
    before = before[~before["event"].isin(DEATH_EVENTS)]
    if before.empty:
        return None
    usage = before["pool_used_blocks"] / before["pool_total_blocks"]
    return float(usage.tail(50).max())
