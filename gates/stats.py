"""The one place kvgate computes percentiles, rates and their confidence intervals.

Percentiles are numpy's default (linear interpolation between order statistics), made safe
for censored observations stored as +inf (a request that never got a first token): a
quantile that lands on or interpolates towards +inf is +inf. contract.quantiles holds that
definition, so the load shapes (which may not import the gates) compute the same one. Their
intervals come from order statistics (distribution-free: no assumption about the latency
distribution), rates' from the Wilson score interval. Both are two-sided at `confidence`;
an end the sample cannot bound is -inf/+inf, and `needs_n` says how many samples would bound
it on the pass side. gates/README.md gives the formulas.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
from scipy.stats import binom, norm

from contract.quantiles import percentile_of_sorted

CONFIDENCE = 0.95
# Beyond this many samples a gate's "needs >= N" is reported as out of reach.
MAX_NEEDED = 10_000_000


def z_value(confidence: float = CONFIDENCE) -> float:
    """The two-sided normal quantile: 1.96 at 95%."""
    return float(norm.ppf(0.5 + confidence / 2))


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The q-th percentile (0..100), numpy's linear method; +inf when it touches censored +inf
    (contract.quantiles defines it for every stage; this sorts an array for it)."""
    return percentile_of_sorted(np.sort(np.asarray(values, dtype=float)), q)


@lru_cache(maxsize=4096)
def order_ranks(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """1-based ranks (r, s) with P(X_(r) <= true q-quantile <= X_(s)) >= confidence.

    The number of observations below the true quantile is Binomial(n, q/100); r = 0 means
    the sample has no lower bound (-inf) and s = n + 1 no upper bound (+inf).
    """
    p = q / 100.0
    alpha = 1.0 - confidence
    r = int(binom.ppf(alpha / 2, n, p))
    s = int(binom.ppf(1 - alpha / 2, n, p)) + 1
    return max(r, 0), min(s, n + 1)


def percentile_interval(
    values: Sequence[float] | np.ndarray, q: float, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Distribution-free interval for the q-th percentile from order statistics."""
    data = np.sort(np.asarray(values, dtype=float))
    n = len(data)
    if n == 0:
        return -math.inf, math.inf
    r, s = order_ranks(n, q, confidence)
    lo = float(data[r - 1]) if r >= 1 else -math.inf
    hi = float(data[s - 1]) if s <= n else math.inf
    return lo, hi


def percentile_needs_n(
    values: Sequence[float] | np.ndarray,
    q: float,
    limit: float,
    upper: bool,
    confidence: float = CONFIDENCE,
) -> int | None:
    """Samples needed for the interval's pass-side end to meet `limit`, if the observed
    distribution held: the upper end at or below it (`upper`), else the lower end at or above
    it. None when the observed distribution itself does not meet the limit."""
    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        return None
    share = float(np.mean(data <= limit)) if upper else float(np.mean(data >= limit))
    return order_needs_n(share, q, upper, confidence, start=len(data))


def order_needs_n(
    share: float, q: float, upper: bool, confidence: float = CONFIDENCE, start: int = 1
) -> int | None:
    """Samples (at least `start`) needed for the q-th percentile's pass-side bound to meet
    a limit when a `share` of the observations lies on the pass side of it (at or below
    the limit when `upper`, at or above it otherwise); None when that share cannot (it must
    exceed q%, or 1 - q% for a lower bound). At share 1, every observation passing, this is
    the least n whose order-statistic bound exists at all: 368 for p(99), 72 for p(95)."""
    p = q / 100.0 if upper else 1.0 - q / 100.0
    if share <= p:
        return None

    def enough(m: int) -> bool:
        s = order_ranks(m, p * 100.0, confidence)[1]
        return s <= m and s <= math.floor(share * m + 1e-9)

    return smallest(enough, start=start)


def median_difference(
    first: Sequence[float] | np.ndarray,
    second: Sequence[float] | np.ndarray,
    confidence: float = CONFIDENCE,
) -> tuple[float, float, float]:
    """Median of the paired differences first[i] - second[i], with its interval.

    The interval is the order-statistic one of the differences' median (the sign test's):
    it assumes nothing about their distribution, only that pairs are independent.
    """
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in length: {a.shape} vs {b.shape}")
    diffs = a - b
    lo, hi = percentile_interval(diffs, 50.0, confidence)
    return percentile(diffs, 50.0), lo, hi


def wilson(successes: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of a proportion (sound at 0/n and n/n, unlike the normal one)."""
    if n <= 0:
        return 0.0, 1.0
    z = z_value(confidence)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson_needs_n(
    rate: float, limit: float, above: bool, strict: bool, confidence: float = CONFIDENCE
) -> int | None:
    """Samples needed, at the observed rate, for the Wilson bound on the pass side to clear
    `limit` (lower bound above it when `above`, upper bound below it otherwise)."""
    if above and (rate < limit or (strict and rate == limit)):
        return None
    if not above and (rate > limit or (strict and rate == limit)):
        return None

    def enough(m: int) -> bool:
        lo, hi = wilson(rate * m, m, confidence)
        bound = lo if above else hi
        if above:
            return bound > limit if strict else bound >= limit
        return bound < limit if strict else bound <= limit

    return smallest(enough, start=1)


def smallest(check: Callable[[int], bool], start: int) -> int | None:
    """The smallest m >= start with check(m) (monotone in m), by doubling then bisection."""
    lo, hi = max(start, 1), max(start, 1)
    while not check(hi):
        lo = hi + 1
        hi *= 2
        if hi > MAX_NEEDED:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if check(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi
