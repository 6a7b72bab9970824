"""A threshold's statistic over a gate's raw observations, with its confidence interval,
and the three-way reading the evaluator turns into a status.

Reading (gates/README.md, "Judging with confidence"):
- breach: the point value breaks the threshold (FAIL, flagged when the interval straddles);
- proven: the interval's pessimistic end meets the threshold and there are at least
  `min_samples` observations (PASS);
- unproven: the point meets it but the evidence cannot show it (MARGINAL, INVALID if key),
  with the samples a conclusive judgement would need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy.stats import linregress
from scipy.stats import t as student_t

from gates import stats
from gates.terms import Threshold


class Reading(StrEnum):
    PROVEN = "proven"
    UNPROVEN = "unproven"
    BREACH = "breach"


@dataclass(frozen=True, slots=True)
class Estimate:
    """The statistic, its two-sided interval and how both were computed."""

    value: float
    lo: float
    hi: float
    n: int
    method: str


def estimate(
    values: np.ndarray, threshold: Threshold, confidence: float, t: np.ndarray | None = None
) -> Estimate:
    """The threshold's statistic over raw values; NaN value when it is undefined for none.

    `slope` needs the observations' times `t` (epoch s): the least-squares slope per hour
    with its Student-t interval (n - 2 degrees of freedom; unbounded below three points)."""
    n = len(values)
    stat = threshold.statistic
    if stat == "slope":
        return _slope(values, t, confidence)
    if stat in ("count", "sum"):
        value = float(n) if stat == "count" else (float(values.sum()) if n else 0.0)
        return Estimate(value, value, value, n, "exact")
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, "")
    if stat == "p":
        assert threshold.quantile is not None
        value = stats.percentile(values, threshold.quantile)
        lo, hi = stats.percentile_interval(values, threshold.quantile, confidence)
        return Estimate(value, lo, hi, n, "order statistics")
    if stat == "rate":
        successes = float(np.clip(values, 0.0, 1.0).sum())
        lo, hi = stats.wilson(successes, n, confidence)
        return Estimate(successes / n, lo, hi, n, "Wilson")
    if stat == "mean":
        value = float(values.mean())
        if n < 2 or not math.isfinite(value):
            return Estimate(value, -math.inf, math.inf, n, "normal approximation")
        half = stats.z_value(confidence) * float(values.std(ddof=1)) / math.sqrt(n)
        if not math.isfinite(half):
            return Estimate(value, -math.inf, math.inf, n, "normal approximation")
        return Estimate(value, value - half, value + half, n, "normal approximation")
    value = float(values.max() if stat == "max" else values.min())
    # An observed extreme is a fact about what was seen; `min_samples` says how much must
    # have been seen before it may pass.
    return Estimate(value, value, value, n, "exact")


def _slope(values: np.ndarray, t: np.ndarray | None, confidence: float) -> Estimate:
    n = len(values)
    if t is None or n < 2:
        return Estimate(math.nan, math.nan, math.nan, n, "")
    hours = (np.asarray(t, dtype=float) - float(np.min(t))) / 3600.0
    if np.ptp(hours) == 0:
        return Estimate(math.nan, math.nan, math.nan, n, "")
    if n >= 3 and np.ptp(values) == 0:  # a constant: a flat line fits exactly
        return Estimate(0.0, 0.0, 0.0, n, "least squares")
    fit = linregress(hours, values)
    slope = float(fit.slope)
    if n < 3 or not math.isfinite(float(fit.stderr)):
        return Estimate(slope, -math.inf, math.inf, n, "least squares")
    half = float(student_t.ppf(0.5 + confidence / 2, n - 2)) * float(fit.stderr)
    return Estimate(slope, slope - half, slope + half, n, "least squares, Student t")


def read(
    est: Estimate, threshold: Threshold, min_samples: int, examined: int, unsure: int = 0
) -> tuple[Reading, bool]:
    """(reading, straddles): where the estimate stands against the threshold's line.

    `examined` is how many records the metric looked at (for a count of violations, the
    observations are the violations; the evidence is everything examined)."""
    if not threshold.holds(est.value):
        optimistic = est.lo if threshold.higher_is_worse else est.hi
        return Reading.BREACH, _holds(threshold, optimistic)
    pessimistic = est.hi if threshold.higher_is_worse else est.lo
    straddles = not _holds(threshold, pessimistic)
    if straddles or examined < min_samples or unsure:
        return Reading.UNPROVEN, straddles
    return Reading.PROVEN, False


def needs_n(
    values: np.ndarray,
    est: Estimate,
    threshold: Threshold,
    min_samples: int,
    examined: int,
    confidence: float,
) -> int | None:
    """Samples a conclusive pass would need if what was observed held (None: out of reach)."""
    needed: int | None = min_samples if examined < min_samples else None
    if threshold.statistic == "p":
        assert threshold.quantile is not None
        upper = threshold.higher_is_worse
        if not _holds(threshold, est.hi if upper else est.lo):
            by_interval = stats.percentile_needs_n(
                values, threshold.quantile, threshold.value, upper, confidence
            )
            needed = by_interval if by_interval is None else max(by_interval, needed or 0)
    elif threshold.statistic == "rate":
        above = threshold.op in (">", ">=")
        if not _holds(threshold, est.lo if above else est.hi):
            by_interval = stats.wilson_needs_n(
                est.value, threshold.value, above, threshold.op in (">", "<"), confidence
            )
            needed = by_interval if by_interval is None else max(by_interval, needed or 0)
    return needed


def healthy_needs_n(
    threshold: Threshold, min_samples: int, confidence: float, anytime: bool = False
) -> int | None:
    """Samples a PASS needs when every observation is on the pass side of the line, as on a
    healthy system: what a plan must deliver before its load starts (harness/sampleplan/).

    The same searches as `needs_n`, at the best a sample can show: a rate of all successes
    (`rate >= 0.99` at 95% needs 381), every observation inside a percentile's line (368 for
    p(99), 72 for p(95)); an exact statistic (count, max, min, sum) needs `min_samples`.
    `anytime`: what the anytime-valid bound needs instead (gates/sequential.py), which a load
    that runs until decided waits for (607 for `rate >= 0.99`). None when no count can be
    named before the data: a mean's or a slope's interval depends on the observations'
    spread, and a line no sample could prove is out of reach."""
    statistic = threshold.statistic
    if statistic in ("mean", "slope"):
        return None
    if anytime and statistic in ("p", "rate"):
        from gates import sequential

        healthy = _healthy_observation(threshold)
        needs = sequential.needs_n(
            np.array([healthy]), threshold, 1 - confidence, min_samples=min_samples
        )
        return None if needs is None else max(needs, min_samples)
    if statistic == "p":
        assert threshold.quantile is not None
        by_interval = stats.order_needs_n(
            1.0, threshold.quantile, threshold.higher_is_worse, confidence
        )
    elif statistic == "rate":
        above = threshold.op in (">", ">=")
        by_interval = stats.wilson_needs_n(
            1.0 if above else 0.0,
            threshold.value,
            above,
            threshold.op in (">", "<"),
            confidence,
        )
    else:
        return min_samples
    return None if by_interval is None else max(by_interval, min_samples)


def _holds(threshold: Threshold, value: float) -> bool:
    return not math.isnan(value) and threshold.holds(value)


def _healthy_observation(threshold: Threshold) -> float:
    """One observation well on the pass side of the line: a success for a rate that must be
    high, a failure-free 0 for one that must be low, 0 for a latency under its line."""
    if threshold.statistic == "rate":
        return 1.0 if threshold.op in (">", ">=") else 0.0
    return 0.0 if threshold.higher_is_worse else 2.0 * abs(threshold.value) + 1.0
