"""Anytime-valid bounds for judging a gate while the load runs: confidence sequences whose
error rate holds however often, and whenever, one looks.

A fixed-n interval covers the truth with probability 1 - alpha at one n chosen in advance;
looked at every few seconds, some look crosses the line by chance far more often than alpha.
A confidence sequence (CS) covers the truth at every n at once: P(some n misses) <= alpha.
Each bound here is the set of values that a nonnegative (super)martingale has not rejected,
so Ville's inequality, P(sup_n M_n >= 1/alpha) <= alpha, gives the guarantee:

- rate (0/1, or any value in [0, 1]): the beta-binomial mixture of likelihood ratios
  (Robbins 1970; Howard, Ramdas, McAuliffe & Sekhon 2021, "Time-uniform, nonparametric,
  nonasymptotic confidence sequences", the conjugate mixture for Bernoulli);
- p(q): the order statistics whose ranks that same mixture bounds, the known p = q/100
  playing the rate (Howard & Ramdas 2022, "Sequential estimation of quantiles with
  applications to A/B-testing and best-arm identification"). Distribution-free, +inf
  (censored) values allowed;
- mean and slope: the t-mixture over a Gaussian linear model (Lai 1976, "On confidence
  sequences"; Lindon, Ham, Tingley & Bojinov 2024, "Anytime-valid linear models and
  regression adjusted causal inference in randomized experiments"); exact for Gaussian
  noise, as the fixed-n Student/normal intervals it replaces assume;
- count, sum (of values >= 0), max, min: no statistics needed. These only move one way as
  records arrive, so what was observed bounds what the end of the run can show: a count of
  one violation against `count == 0` is decided; no count of zero is, before the end.

`needs_n` says about how many observations a bound needs before it decides, if the ones to come
look like those so far: what a load that runs until its gates are decided is waiting for.

gates/README.md ("Judging while the load runs") gives the rules; gates/sequential_coverage.py
checks the guarantee by simulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy.special import betaln, xlogy

from gates import stats
from gates.terms import Threshold

# The mixtures are tuned (their prior's spread chosen) to be tightest near these sample
# sizes; any fixed choice keeps the guarantee, this one only decides where the bound is
# narrowest. Rates and quantiles: a run's requests; mean: a gate's records; slope: windows.
N_OPT_RATE = 1000
N_OPT_MEAN = 100
N_OPT_SLOPE = 10
_BISECTIONS = 64


class Decided(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNDECIDED = "UNDECIDED"


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a gate stands by its anytime-valid bound [lo, hi] on `n` observations."""

    state: Decided
    lo: float
    hi: float
    n: int
    method: str
    alpha: float


def mixture_strength(alpha: float, information: float) -> float:
    """The prior's precision that makes a normal-like mixture tightest at `information`
    (observations; for a slope, the design's sum of squares): information / (2 log(1/alpha)
    + log(1 + 2 log(1/alpha))), the approximate optimum of the normal mixture (Howard et al.
    2021; Waudby-Smith et al. 2024, "Time-uniform central limit theory and asymptotic
    confidence sequences")."""
    two_log = 2 * math.log(1 / alpha)
    return information / (two_log + math.log1p(two_log))


def _beta_prior(centre: float, alpha: float) -> tuple[float, float]:
    """Jeffreys' Beta(1/2, 1/2) plus pseudo-observations at `centre`: mass where the
    decision is hard (the gate's line), and never zero anywhere."""
    k = mixture_strength(alpha, N_OPT_RATE)
    return 0.5 + k * centre, 0.5 + k * (1 - centre)


def log_mixture(
    successes: np.ndarray, n: np.ndarray, p: np.ndarray, a: float, b: float
) -> np.ndarray:
    """log M_n(p) = log int L(theta) / L(p) dBeta(a, b)(theta) = log B(a + S, b + n - S) -
    log B(a, b) - S log p - (n - S) log(1 - p): the beta-binomial mixture martingale at p.
    For values in [0, 1] that are not 0/1 it is a supermartingale (x -> c^x is convex)."""
    return np.asarray(
        betaln(a + successes, b + n - successes)
        - betaln(a, b)
        - xlogy(successes, p)
        - xlogy(n - successes, 1 - p),
        dtype=float,
    )


def _bisect(
    excluded: Callable[[np.ndarray], np.ndarray], inside: np.ndarray, outside: np.ndarray
) -> np.ndarray:
    """The boundary between an accepted point `inside` and a rejected `outside` of a
    convex rejection set, vectorised; returns the rejected side (the bound stays wide)."""
    inside, outside = inside.astype(float), outside.astype(float)
    for _ in range(_BISECTIONS):
        mid = (inside + outside) / 2
        out = excluded(mid)
        outside = np.where(out, mid, outside)
        inside = np.where(out, inside, mid)
    return outside


def rate_bounds(
    successes: np.ndarray | float, n: np.ndarray | int, alpha: float, centre: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Time-uniform bounds on a rate after `successes` of `n`: {p : M_n(p) < 1/alpha}, an
    interval (M_n is convex in p). `centre`: where the mixture's prior sits (the line)."""
    s = np.asarray(successes, dtype=float)
    m = np.broadcast_to(np.asarray(n, dtype=float), s.shape)
    a, b = _beta_prior(centre, alpha)
    limit = math.log(1 / alpha)

    def excluded(p: np.ndarray) -> np.ndarray:
        return log_mixture(s, m, p, a, b) >= limit

    with np.errstate(divide="ignore", invalid="ignore"):
        phat = np.where(m > 0, s / np.maximum(m, 1), 0.5)
        lo = _bisect(excluded, phat, np.zeros_like(phat))
        hi = _bisect(excluded, phat, np.ones_like(phat))
    lo = np.where((s <= 0) | (m <= 0), 0.0, lo)
    hi = np.where((s >= m) | (m <= 0), 1.0, hi)
    return lo, hi


def quantile_ranks(n: np.ndarray | int, q: float, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """1-based ranks (r, s) with X_(r) <= Q <= X_(s) at every n at once, P >= 1 - alpha.

    With U_i uniform and X_i = F^-1(U_i), S_n = #{U_i <= q/100} is Binomial(n, q/100), and
    #{X_i < Q} <= S_n <= #{X_i <= Q}. So where the mixture keeps S_n within [r_n, s_n - 1]
    for all n, at least r_n observations are <= Q and fewer than s_n are < Q. r = 0: no
    lower bound (-inf); s = n + 1: no upper bound (+inf). Ties and censoring change nothing.
    """
    m = np.asarray(n, dtype=float)
    p = q / 100.0
    a, b = _beta_prior(p, alpha)
    limit = math.log(1 / alpha)

    def excluded(s: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return log_mixture(s, m, np.full_like(s, p), a, b) >= limit

    centre = m * p  # accepted: M_n(np) = E_prior[exp(-n KL(p, theta))] <= 1
    lo = np.ceil(_bisect(excluded, centre, np.zeros_like(m)))
    hi = np.floor(_bisect(excluded, centre, m))
    # the integers nearest the boundary, checked exactly (bisection ends a hair away)
    lo = np.where(excluded(lo) & (lo < centre), lo + 1, lo)
    lo = np.where((lo >= 1) & ~excluded(np.maximum(lo - 1, 0)), lo - 1, lo)
    hi = np.where(excluded(hi) & (hi > centre), hi - 1, hi)
    hi = np.where((hi <= m - 1) & ~excluded(np.minimum(hi + 1, m)), hi + 1, hi)
    return lo.astype(int), (hi + 1).astype(int)


def quantile_bounds(values: np.ndarray, q: float, alpha: float) -> tuple[float, float]:
    """Time-uniform bounds on the q-th percentile (0..100) from order statistics."""
    data = np.sort(np.asarray(values, dtype=float))
    n = len(data)
    if n == 0:
        return -math.inf, math.inf
    r, s = (int(x) for x in quantile_ranks(n, q, alpha))
    lo = float(data[r - 1]) if r >= 1 else -math.inf
    hi = float(data[s - 1]) if s <= n else math.inf
    return lo, hi


def t_mixture_factor(nu: np.ndarray, z2: np.ndarray, phi: float, alpha: float) -> np.ndarray:
    """Half-width of the t-mixture CS in standard errors (+inf where it cannot bound yet).

    The mixture Bayes factor of a coefficient with t statistic t, nu residual degrees of
    freedom and information z2 = sigma^2 / se^2, prior N(beta0, sigma^2 / phi), is
    sqrt(r) ((1 + t^2/nu) / (1 + r t^2/nu))^((nu + 1)/2), r = phi / (phi + z2); it stays
    below 1/alpha exactly while t^2 < nu (1 - x) / (x - r), x = (r alpha^2)^(1/(nu + 1))."""
    nu, z2 = np.asarray(nu, dtype=float), np.asarray(z2, dtype=float)
    r = phi / (phi + z2)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        x = (r * alpha**2) ** (1 / (nu + 1))
        factor = np.sqrt(nu * (1 - x) / (x - r))
    return np.where((nu >= 1) & (x > r), factor, math.inf)


def mean_factor(n: np.ndarray, alpha: float) -> np.ndarray:
    """The mean's half-width in standard errors s / sqrt(n) after n observations."""
    m = np.asarray(n, dtype=float)
    return t_mixture_factor(m - 1, m, mixture_strength(alpha, N_OPT_MEAN), alpha)


def slope_factor(n: np.ndarray, sxx: np.ndarray, spacing_h: float, alpha: float) -> np.ndarray:
    """The slope's half-width in standard errors after n points whose times have the sum of
    squares `sxx` (hours^2); the prior is tuned for N_OPT_SLOPE points `spacing_h` apart."""
    design = spacing_h**2 * N_OPT_SLOPE * (N_OPT_SLOPE**2 - 1) / 12
    m = np.asarray(n, dtype=float)
    return t_mixture_factor(m - 2, sxx, mixture_strength(alpha, design), alpha)


def mean_bounds(values: np.ndarray, alpha: float) -> tuple[float, float]:
    """Time-uniform bounds on a mean (Gaussian t-mixture, prior tuned for N_OPT_MEAN)."""
    data = np.asarray(values, dtype=float)
    n = len(data)
    if n < 2 or not np.isfinite(data).all():
        return -math.inf, math.inf
    centre, se = float(data.mean()), float(data.std(ddof=1)) / math.sqrt(n)
    half = se * float(mean_factor(np.array(n), alpha))
    return (centre - half, centre + half) if math.isfinite(half) else (-math.inf, math.inf)


def slope_bounds(values: np.ndarray, t: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """(slope per hour, lo, hi): least squares with time-uniform bounds (t-mixture).

    The prior's scale is set by the design alone, fixed once the first three times are
    known: tuned for N_OPT_SLOPE windows at their first spacing."""
    y = np.asarray(values, dtype=float)
    n = len(y)
    hours = (np.asarray(t, dtype=float) - float(np.min(t))) / 3600.0 if n else np.array([])
    if n < 3 or not np.isfinite(y).all():
        return math.nan, -math.inf, math.inf
    first = np.sort(hours)[:3]
    spacing = float(first[2] - first[0]) / 2
    sxx = float(((hours - hours.mean()) ** 2).sum())
    if spacing <= 0 or sxx <= 0:
        return math.nan, -math.inf, math.inf
    slope = float(((hours - hours.mean()) * (y - y.mean())).sum()) / sxx
    residual = y - y.mean() - slope * (hours - hours.mean())
    se = math.sqrt(float((residual**2).sum()) / (n - 2) / sxx)
    half = se * float(slope_factor(np.array(n), np.array(sxx), spacing, alpha))
    if not math.isfinite(half):
        return slope, -math.inf, math.inf
    return slope, slope - half, slope + half


def bound(
    values: np.ndarray, threshold: Threshold, alpha: float, t: np.ndarray | None = None
) -> tuple[float, float, str]:
    """(lo, hi, method): where the statistic can be, now and at every later look."""
    data = np.asarray(values, dtype=float)
    stat = threshold.statistic
    n = len(data)
    if stat == "count":
        return float(n), math.inf, "observed so far (a count only grows)"
    if stat == "sum":
        if (data >= 0).all():
            return float(data.sum()), math.inf, "observed so far (a sum of values >= 0 only grows)"
        return -math.inf, math.inf, "a sum with negative values can go either way"
    if n == 0:
        return math.nan, math.nan, ""
    if stat == "max":
        return float(data.max()), math.inf, "observed so far (a maximum only grows)"
    if stat == "min":
        return -math.inf, float(data.min()), "observed so far (a minimum only falls)"
    if stat == "rate":
        clipped = np.clip(data, 0.0, 1.0)
        lo, hi = rate_bounds(float(clipped.sum()), n, alpha, centre=_centre(threshold))
        return float(lo), float(hi), "beta-binomial mixture confidence sequence"
    if stat == "p":
        assert threshold.quantile is not None
        lo_q, hi_q = quantile_bounds(data, threshold.quantile, alpha)
        return lo_q, hi_q, "order statistics, beta-binomial mixture ranks"
    if stat == "mean":
        return (*mean_bounds(data, alpha), "t-mixture confidence sequence")
    if stat == "slope":
        if t is None:
            return -math.inf, math.inf, ""
        _, lo_s, hi_s = slope_bounds(data, t, alpha)
        return lo_s, hi_s, "least squares, t-mixture confidence sequence"
    raise ValueError(f"no anytime-valid bound for statistic {stat!r}")


def _centre(threshold: Threshold) -> float:
    return min(max(threshold.value, 0.0), 1.0)


def decide(
    values: np.ndarray,
    threshold: Threshold,
    alpha: float,
    *,
    t: np.ndarray | None = None,
    examined: int | None = None,
    min_samples: int = 1,
    unsure: int = 0,
) -> Decision:
    """PASS when every value the bound allows meets the line (with `min_samples` examined
    and nothing unsure), FAIL when none does, else UNDECIDED. `examined`: the records the
    metric looked at (for a count of violations the observations are the violations)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be within (0, 1), got {alpha}; it is 1 - confidence")
    n = len(values) if examined is None else examined
    lo, hi, method = bound(values, threshold, alpha, t)
    if n == 0 or math.isnan(lo) or math.isnan(hi):
        return Decision(Decided.UNDECIDED, math.nan, math.nan, n, method, alpha)
    state = Decided.UNDECIDED
    if _nowhere(threshold, lo, hi):
        state = Decided.FAIL
    elif _everywhere(threshold, lo, hi) and n >= min_samples and not unsure:
        state = Decided.PASS
    return Decision(state, lo, hi, n, method, alpha)


def _everywhere(threshold: Threshold, lo: float, hi: float) -> bool:
    """Whether every value in [lo, hi] meets the line."""
    if threshold.op == "==":
        return lo == hi == threshold.value
    if threshold.op == "!=":
        return not lo <= threshold.value <= hi
    return threshold.holds(lo) and threshold.holds(hi)


def _nowhere(threshold: Threshold, lo: float, hi: float) -> bool:
    """Whether no value in [lo, hi] meets the line."""
    if threshold.op == "==":
        return not lo <= threshold.value <= hi
    if threshold.op == "!=":
        return lo == hi == threshold.value
    return not threshold.holds(lo) and not threshold.holds(hi)


# The statistics whose bound is what was observed so far: only the end of the run can pass them.
ONE_WAY = ("count", "sum", "max", "min")


def needs_n(
    values: np.ndarray,
    threshold: Threshold,
    alpha: float,
    *,
    t: np.ndarray | None = None,
    min_samples: int = 1,
    unsure: int = 0,
) -> int | None:
    """About how many observations the bound needs to decide the gate, PASS or FAIL, if the
    ones to come look like those so far: the same share (rate), the same distribution (p(q):
    order statistic k of m read as the observed quantile k/m), the same mean and spread, the
    same slope and noise at the same spacing. The current n when it is decided already.
    None where no number of observations decides it: a value on the line, a statistic only
    the end of the run can pass (count, sum, max, min: ONE_WAY), beyond stats.MAX_NEEDED."""
    data = np.asarray(values, dtype=float)
    now = decide(data, threshold, alpha, t=t, min_samples=min_samples, unsure=unsure)
    if now.state != Decided.UNDECIDED:
        return len(data)
    at = _bound_at(data, threshold, alpha, t)
    if at is None:
        return None

    def decided(m: int) -> bool:
        lo, hi = at(m)
        if _nowhere(threshold, lo, hi):
            return True
        return _everywhere(threshold, lo, hi) and m >= min_samples and not unsure

    return stats.smallest(decided, start=len(data) + 1)


def _bound_at(
    data: np.ndarray, threshold: Threshold, alpha: float, t: np.ndarray | None
) -> Callable[[int], tuple[float, float]] | None:
    """The bound [lo, hi] after m observations like `data`, for `needs_n`; None where more of
    the same would decide nothing (see needs_n)."""
    stat, n = threshold.statistic, len(data)
    if n == 0 or stat in ONE_WAY:
        return None
    if stat == "rate":
        share, centre = float(np.clip(data, 0.0, 1.0).mean()), _centre(threshold)

        def rate_at(m: int) -> tuple[float, float]:
            lo, hi = rate_bounds(share * m, m, alpha, centre=centre)
            return float(lo), float(hi)

        return rate_at
    if stat == "p":
        assert threshold.quantile is not None
        ordered, q = np.sort(data), threshold.quantile

        def observed(rank: int, m: int) -> float:
            return float(ordered[min(n, max(1, math.ceil(rank * n / m))) - 1])

        def quantile_at(m: int) -> tuple[float, float]:
            r, s = (int(x) for x in quantile_ranks(m, q, alpha))
            lo = observed(r, m) if r >= 1 else -math.inf
            return lo, (observed(s, m) if s <= m else math.inf)

        return quantile_at
    if not np.isfinite(data).all():
        return None
    if stat == "mean" and n >= 2:
        return _spread_at(float(data.mean()), float(data.std(ddof=1)), alpha)
    if stat == "slope" and t is not None and n >= 3:
        return _slope_at(data, np.asarray(t, dtype=float), alpha)
    return None


def _spread_at(centre: float, sd: float, alpha: float) -> Callable[[int], tuple[float, float]]:
    def mean_at(m: int) -> tuple[float, float]:
        half = sd / math.sqrt(m) * float(mean_factor(np.array(m), alpha))
        return (centre - half, centre + half) if math.isfinite(half) else (-math.inf, math.inf)

    return mean_at


def _slope_at(
    values: np.ndarray, t: np.ndarray, alpha: float
) -> Callable[[int], tuple[float, float]] | None:
    """A slope's bound after m windows at the observed mean spacing, with the observed
    slope and residual noise; the prior's spacing is slope_bounds' (the first three)."""
    hours = (t - float(t.min())) / 3600.0
    slope, _, _ = slope_bounds(values, t, alpha)
    spacing = float(np.ptp(hours)) / (len(hours) - 1)
    first = np.sort(hours)[:3]
    prior_spacing = float(first[2] - first[0]) / 2
    if math.isnan(slope) or spacing <= 0 or prior_spacing <= 0:
        return None
    residual = values - values.mean() - slope * (hours - hours.mean())
    sigma = math.sqrt(float((residual**2).sum()) / (len(values) - 2))

    def slope_at(m: int) -> tuple[float, float]:
        sxx = spacing**2 * m * (m**2 - 1) / 12
        factor = float(slope_factor(np.array(m), np.array(sxx), prior_spacing, alpha))
        half = sigma / math.sqrt(sxx) * factor
        return (slope - half, slope + half) if math.isfinite(half) else (-math.inf, math.inf)

    return slope_at
