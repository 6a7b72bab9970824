"""Anytime-valid bounds: looked at after every observation they keep their error rate,
where today's fixed-n intervals looked at as often do not; and the decisions they give."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, linregress

from gates import sequential, stats
from gates.estimate import Reading, estimate, read
from gates.sequential import Decided, decide
from gates.sequential_coverage import Coverage, simulate
from gates.terms import Threshold

ALPHA = 0.05


@pytest.fixture(scope="module")
def coverage() -> dict[str, Coverage]:
    return {row.statistic: row for row in simulate(streams=1000, alpha=ALPHA)}


def allowance(streams: int) -> float:
    """The most false decisions a bound of error rate alpha shows over `streams` streams
    but one time in a thousand (the binomial's 99.9% quantile)."""
    return float(binom.ppf(0.999, streams, ALPHA)) / streams


@pytest.mark.parametrize("statistic", ["rate", "p(95)", "mean", "slope"])
def test_looking_after_every_observation_keeps_the_error_rate(
    coverage: dict[str, Coverage], statistic: str
) -> None:
    row = coverage[statistic]
    assert row.looks >= 58 and row.streams == 1000
    assert row.anytime <= allowance(row.streams), row
    # the same streams judged by the fixed-n interval at every look: many decide wrongly
    assert row.fixed > allowance(row.streams), row
    assert row.fixed > 5 * row.anytime, row


def test_the_simulations_fixed_rate_interval_is_wilsons() -> None:
    """The simulation reads the Wilson interval as the score test it inverts: p is out
    exactly when |S - np| > z sqrt(np(1-p))."""
    z, p = stats.z_value(0.95), 0.99
    for n in (10, 100, 1000):
        for s in range(0, n + 1, max(1, n // 200)):
            lo, hi = stats.wilson(s, n, 0.95)
            assert (not lo <= p <= hi) == (abs(s - n * p) > z * math.sqrt(n * p * (1 - p)))


def test_rate_bounds_are_where_the_mixture_crosses_one_over_alpha() -> None:
    successes = np.array([0.0, 3, 50, 990, 999, 1000, 2.5])
    n = np.array([1000.0, 10, 100, 1000, 1000, 1000, 4])
    lo, hi = sequential.rate_bounds(successes, n, ALPHA, centre=0.99)
    a, b = sequential._beta_prior(0.99, ALPHA)
    limit = math.log(1 / ALPHA)
    for s, m, low, high in zip(successes, n, lo, hi, strict=True):
        grid = np.linspace(1e-6, 1 - 1e-6, 20001)
        kept = sequential.log_mixture(np.full_like(grid, s), np.full_like(grid, m), grid, a, b)
        inside = grid[kept < limit]
        assert low <= inside.min() and inside.max() <= high
        assert inside.min() - low < 1e-4 and high - inside.max() < 1e-4
        assert low <= s / m <= high
    assert lo[0] == 0.0 and hi[5] == 1.0


@pytest.mark.parametrize("q", [50.0, 95.0, 99.0])
def test_quantile_ranks_are_the_mixtures_accepted_counts(q: float) -> None:
    a, b = sequential._beta_prior(q / 100, ALPHA)
    ns = [1, 5, 50, 333, 1000]
    r, s = sequential.quantile_ranks(np.array(ns), q, ALPHA)
    for n, low, high in zip(ns, r, s, strict=True):
        counts = np.arange(n + 1, dtype=float)
        mixture = sequential.log_mixture(
            counts, np.full_like(counts, n), np.full_like(counts, q / 100), a, b
        )
        accepted = np.nonzero(mixture < math.log(1 / ALPHA))[0]
        assert (low, high) == (accepted.min(), accepted.max() + 1)


def test_quantile_bounds_pick_order_statistics_and_keep_censored_values() -> None:
    rng = np.random.default_rng(3)
    values = rng.exponential(1.0, 1000)
    values[:40] = math.inf  # 4% never answered: the p95's upper order statistic is one
    r, s = (int(x) for x in sequential.quantile_ranks(1000, 95, ALPHA))
    lo, hi = sequential.quantile_bounds(values, 95, ALPHA)
    ordered = np.sort(values)
    assert (lo, hi) == (ordered[r - 1], ordered[s - 1])
    assert math.isfinite(lo) and hi == math.inf
    assert sequential.quantile_bounds(np.array([]), 95, ALPHA) == (-math.inf, math.inf)


def test_the_anytime_bound_is_wider_than_todays_interval() -> None:
    """The price of looking often: at one n the time-uniform bound is the wider."""
    lo, hi = sequential.rate_bounds(990.0, 1000, ALPHA, centre=0.99)
    w_lo, w_hi = stats.wilson(990, 1000, 0.95)
    assert lo < w_lo and hi > w_hi
    values = np.random.default_rng(4).lognormal(-1, 0.5, 1000)
    a_lo, a_hi = sequential.quantile_bounds(values, 95, ALPHA)
    f_lo, f_hi = stats.percentile_interval(values, 95, 0.95)
    assert a_lo <= f_lo and a_hi >= f_hi and (a_lo, a_hi) != (f_lo, f_hi)


def test_slope_bounds_centre_on_least_squares() -> None:
    t = np.arange(20) * 120.0
    hours = t / 3600
    y = 0.05 * hours + np.random.default_rng(5).normal(0, 0.01, 20)
    slope, lo, hi = sequential.slope_bounds(y, t, ALPHA)
    fit = linregress(hours, y)
    assert slope == pytest.approx(fit.slope)
    sxx = np.array(float(((hours - hours.mean()) ** 2).sum()))
    factor = sequential.slope_factor(np.array(20), sxx, 120 / 3600, ALPHA)
    assert (hi - lo) / 2 == pytest.approx(float(factor) * fit.stderr)
    fixed = estimate(y, Threshold.model_validate("slope <= 1"), 0.95, t)
    assert lo < fixed.lo and hi > fixed.hi


# -- decisions ------------------------------------------------------------------------------


def th(text: str) -> Threshold:
    return Threshold.model_validate(text)


def test_one_violation_decides_a_count_and_none_decides_nothing() -> None:
    """An observed violation is decisive (a count only grows); no count of zero is, while
    records are still coming."""
    assert decide(np.array([1.0]), th("count == 0"), ALPHA, examined=50).state == Decided.FAIL
    quiet = decide(np.array([]), th("count == 0"), ALPHA, examined=10_000)
    assert quiet.state == Decided.UNDECIDED and (quiet.lo, quiet.hi) == (0.0, math.inf)
    assert decide(np.array([]), th("count == 0"), ALPHA, examined=0).state == Decided.UNDECIDED


def test_an_extreme_past_the_line_is_decided_one_within_it_is_not() -> None:
    shares = np.array([0.05, 0.2, 0.1])
    assert decide(shares, th("max <= 0.15"), ALPHA).state == Decided.FAIL
    assert decide(shares[[0, 2]], th("max <= 0.15"), ALPHA).state == Decided.UNDECIDED
    assert decide(shares, th("min >= 0.08"), ALPHA).state == Decided.FAIL
    assert decide(np.array([-1.0, 5.0]), th("sum <= 3"), ALPHA).state == Decided.UNDECIDED


def test_a_rate_passes_later_than_at_fixed_n_and_a_clear_breach_fails() -> None:
    """600 of 600 clears `rate >= 0.99` at fixed n (from 381); looked at all along, it is
    not yet proof. 3000 of 3000 is; 540 of 600 is a decided FAIL."""
    line = th("rate >= 0.99")
    ones = np.ones(600)
    reading, _ = read(estimate(ones, line, 0.95), line, 1, 600)
    assert reading == Reading.PROVEN
    assert decide(ones, line, ALPHA).state == Decided.UNDECIDED
    assert decide(np.ones(3000), line, ALPHA).state == Decided.PASS
    breach = decide(np.r_[np.zeros(60), np.ones(540)], line, ALPHA)
    assert breach.state == Decided.FAIL and breach.hi < 0.99


def test_a_pass_needs_its_minimum_samples_and_nothing_unsure() -> None:
    line, ones = th("rate >= 0.99"), np.ones(3000)
    assert decide(ones, line, ALPHA, min_samples=5000).state == Decided.UNDECIDED
    assert decide(ones, line, ALPHA, unsure=1).state == Decided.UNDECIDED
    assert decide(np.zeros(3000), line, ALPHA, min_samples=5000).state == Decided.FAIL


def test_percentile_decisions_count_requests_never_answered() -> None:
    rng = np.random.default_rng(6)
    fast = rng.exponential(0.1, 2000)
    assert decide(fast, th("p(95) <= 900ms"), ALPHA).state == Decided.PASS
    lost = fast.copy()
    lost[:200] = math.inf  # 10% never answered: the p95 is +inf
    decision = decide(lost, th("p(95) <= 900ms"), ALPHA)
    assert decision.state == Decided.FAIL and decision.lo == math.inf
    assert decide(fast[:100], th("p(95) <= 900ms"), ALPHA).state == Decided.UNDECIDED


def test_mean_and_slope_decisions() -> None:
    rng = np.random.default_rng(7)
    assert decide(rng.normal(1.0, 1.0, 500), th("mean <= 2"), ALPHA).state == Decided.PASS
    assert decide(rng.normal(3.0, 1.0, 500), th("mean <= 2"), ALPHA).state == Decided.FAIL
    censored = np.r_[rng.normal(1.0, 1.0, 500), math.inf]
    assert decide(censored, th("mean <= 2"), ALPHA).state == Decided.UNDECIDED
    t = np.arange(12) * 30.0
    leak = 0.5 * t / 3600 + rng.normal(0, 0.001, 12)  # +0.5 of the pool per hour
    assert decide(leak, th("slope <= 0.02"), ALPHA, t=t).state == Decided.FAIL
    assert decide(leak[:4], th("slope <= 0.02"), ALPHA, t=t[:4]).state == Decided.UNDECIDED
    assert decide(leak, th("slope <= 0.02"), ALPHA).state == Decided.UNDECIDED  # no times


def test_equality_lines() -> None:
    far = np.r_[np.zeros(900), np.ones(100)]
    assert decide(far, th("rate != 0.5"), ALPHA).state == Decided.PASS
    assert decide(far, th("rate == 0.5"), ALPHA).state == Decided.FAIL


def test_bad_alpha_is_refused_with_what_it_is() -> None:
    with pytest.raises(ValueError, match="1 - confidence"):
        decide(np.ones(3), th("rate >= 0.5"), 1.5)


def test_needs_n_is_where_more_of_the_same_would_first_be_decided() -> None:
    """n of n served: `rate >= 0.99` is first decided at 607 (the figure gates/README.md
    gives), whatever n it is asked at; 90% of p95 samples far under the line decide it at
    177, a p95 first bounded there; a breach is decided sooner than a pass of the same
    margin would be."""
    line = th("rate >= 0.99")
    for n in (10, 100, 600):
        assert sequential.needs_n(np.ones(n), line, ALPHA) == 607
    assert decide(np.ones(607), line, ALPHA).state == Decided.PASS
    assert decide(np.ones(606), line, ALPHA).state == Decided.UNDECIDED
    assert sequential.needs_n(np.ones(3000), line, ALPHA) == 3000  # decided already
    assert sequential.needs_n(np.ones(100), line, ALPHA, min_samples=5000) == 5000
    assert sequential.needs_n(np.ones(100), line, ALPHA, unsure=1) is None  # never a PASS
    rng = np.random.default_rng(3)
    assert sequential.needs_n(rng.exponential(0.1, 40), th("p(95) <= 900ms"), ALPHA) == 177
    breach = np.r_[np.zeros(4), np.ones(96)]  # 96% against a 99% line: not yet decided
    needed = sequential.needs_n(breach, line, ALPHA)
    assert needed is not None and 100 < needed < 607
    repeated = np.tile(breach, needed // 100 + 1)[:needed]
    assert decide(repeated, line, ALPHA).state == Decided.FAIL


def test_needs_n_for_means_and_slopes_and_where_nothing_would_decide() -> None:
    rng = np.random.default_rng(4)
    sample = rng.normal(1.8, 1.0, 20)
    line = th("mean <= 2")
    needed = sequential.needs_n(sample, line, ALPHA)
    assert needed is not None and needed > 20

    def like_sample(m: int) -> np.ndarray:
        """m values with exactly the sample's mean and standard deviation."""
        z = rng.standard_normal(m)
        return np.asarray(sample.mean() + sample.std(ddof=1) * (z - z.mean()) / z.std(ddof=1))

    assert decide(like_sample(needed), line, ALPHA).state == Decided.PASS
    assert decide(like_sample(needed - 1), line, ALPHA).state == Decided.UNDECIDED
    t = np.arange(4) * 120.0
    flat = rng.normal(0, 0.001, 4)
    windows = sequential.needs_n(flat, th("slope <= 0.02"), ALPHA, t=t)
    assert windows is not None and 4 < windows < 60
    assert sequential.needs_n(np.ones(50), th("count == 0"), ALPHA) == 50  # 50 violations
    assert sequential.needs_n(np.array([]), th("count == 0"), ALPHA) is None  # end of run
    assert sequential.needs_n(np.full(50, 0.1), th("max <= 0.15"), ALPHA) is None
    assert sequential.needs_n(np.r_[np.zeros(10), np.ones(10)], th("rate >= 0.5"), ALPHA) is None
