"""The anytime-valid bounds' guarantee, checked by simulation against today's fixed-n
intervals looked at just as often: `python -m gates.sequential_coverage [--streams N]`.

Each case draws synthetic streams with a known true value and looks after every
observation. A stream counts as a false decision when, at some look, the bound leaves the
truth out: a gate whose line sits at the truth would then have been decided wrongly. The
anytime bound must stay at or under alpha; the fixed-n interval, looked at as often, does
not. gates/README.md ("Judging while the load runs") shows the figures.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t

from gates import sequential, stats

STREAMS = 1000
ALPHA = 0.05
SEED = 1
CENSORED = 0.02  # the latency streams' share of requests never answered (+inf)
WINDOW_S = 120.0  # the slope streams' window


@dataclass(frozen=True, slots=True)
class Coverage:
    """How often one statistic's bounds ever left the truth out, over `streams` streams."""

    statistic: str
    truth: str
    looks: int
    streams: int
    anytime: float
    fixed: float


def simulate(streams: int = STREAMS, alpha: float = ALPHA, seed: int = SEED) -> list[Coverage]:
    """Every case, each from its own generator so that adding one changes no other."""
    cases: list[Callable[[np.random.Generator, int, float], Coverage]] = [
        _rate,
        _quantile,
        _mean,
        _slope,
    ]
    return [case(np.random.default_rng([seed, i]), streams, alpha) for i, case in enumerate(cases)]


def _rate(rng: np.random.Generator, streams: int, alpha: float) -> Coverage:
    """`rate >= 0.99` at a true rate of 0.99: availability on its line."""
    p, n_max = 0.99, 2000
    successes = np.cumsum(rng.random((streams, n_max)) < p, axis=1)
    n = np.broadcast_to(np.arange(1, n_max + 1), successes.shape)
    # each (successes, n) pair once: streams share most of them
    keys, where = np.unique(successes * (n_max + 1) + n, return_inverse=True)
    lo, hi = sequential.rate_bounds(keys // (n_max + 1), keys % (n_max + 1), alpha, centre=p)
    anytime = ((lo > p) | (hi < p))[where].reshape(successes.shape)
    # The Wilson interval is the score test's: it leaves p out when |S - np| > z sd.
    z = stats.z_value(1 - alpha)
    fixed = np.abs(successes - n * p) > z * np.sqrt(n * p * (1 - p))
    return Coverage("rate", f"Bernoulli({p:g})", n_max, streams, _ever(anytime), _ever(fixed))


def _quantile(rng: np.random.Generator, streams: int, alpha: float) -> Coverage:
    """`p(95)` of exponential latencies (mean 1 s) with 2% never answered (+inf)."""
    q, n_max = 95.0, 2000
    latency = rng.exponential(1.0, (streams, n_max))
    latency[rng.random((streams, n_max)) < CENSORED] = math.inf
    true = -math.log(1 - q / 100 / (1 - CENSORED))
    # X_(r) > Q exactly when fewer than r values are <= Q; X_(s) < Q when s or more are < Q
    at_most = np.cumsum(latency <= true, axis=1)
    below = np.cumsum(latency < true, axis=1)
    n = np.arange(1, n_max + 1)
    r, s = sequential.quantile_ranks(n, q, alpha)
    fixed_r, fixed_s = np.array([stats.order_ranks(int(m), q, 1 - alpha) for m in n]).T
    anytime = (at_most < r) | (below >= s)
    fixed = (at_most < fixed_r) | (below >= fixed_s)
    truth = f"exponential, {CENSORED:.0%} +inf"
    return Coverage(f"p({q:g})", truth, n_max, streams, _ever(anytime), _ever(fixed))


def _mean(rng: np.random.Generator, streams: int, alpha: float) -> Coverage:
    """`mean` of Gaussian values, looked at from the second on."""
    n_max = 1000
    x = rng.normal(0.0, 1.0, (streams, n_max))
    n = np.arange(1, n_max + 1)
    mean = np.cumsum(x, axis=1) / n
    sd = np.sqrt(np.maximum(np.cumsum(x**2, axis=1) - n * mean**2, 0) / np.maximum(n - 1, 1))
    se = (sd / np.sqrt(n))[:, 1:]
    anytime = np.abs(mean[:, 1:]) > sequential.mean_factor(n[1:], alpha) * se
    fixed = np.abs(mean[:, 1:]) > stats.z_value(1 - alpha) * se  # estimate.py's interval
    return Coverage("mean", "Normal(0, 1)", n_max - 1, streams, _ever(anytime), _ever(fixed))


def _slope(rng: np.random.Generator, streams: int, alpha: float) -> Coverage:
    """`slope` of a flat series with Gaussian noise, one value per 120 s window, two hours,
    looked at from the third window on (the least-squares fit's first)."""
    n_max = 60
    hours = np.arange(n_max) * WINDOW_S / 3600
    y = rng.normal(0.0, 1.0, (streams, n_max))
    n = np.arange(1, n_max + 1)
    sum_h, sum_hh = np.cumsum(hours), np.cumsum(hours**2)
    sum_y, sum_hy, sum_yy = (np.cumsum(v, axis=1) for v in (y, hours * y, y**2))
    sxx = sum_hh - sum_h**2 / n
    with np.errstate(divide="ignore", invalid="ignore"):
        sxy = sum_hy - sum_h * sum_y / n
        slope = sxy / sxx
        sse = np.maximum(sum_yy - sum_y**2 / n - slope * sxy, 0)
        se = np.sqrt(sse / (n - 2) / sxx)
    looks = slice(2, None)
    factor = sequential.slope_factor(n[looks], sxx[looks], WINDOW_S / 3600, alpha)
    anytime = np.abs(slope[:, looks]) > factor * se[:, looks]
    fixed_factor = student_t.ppf(1 - alpha / 2, n[looks] - 2)  # estimate.py's interval
    fixed = np.abs(slope[:, looks]) > fixed_factor * se[:, looks]
    truth = f"flat, Normal noise, {WINDOW_S:g} s windows"
    return Coverage("slope", truth, n_max - 2, streams, _ever(anytime), _ever(fixed))


def _ever(missed: np.ndarray) -> float:
    return float(missed.any(axis=1).mean())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gates.sequential_coverage")
    parser.add_argument("--streams", type=int, default=STREAMS, help="streams per statistic")
    parser.add_argument("--alpha", type=float, default=ALPHA, help="1 - the gates' confidence")
    args = parser.parse_args(argv)
    if args.streams < 1 or not 0 < args.alpha < 1:
        parser.error("--streams must be at least 1 and --alpha within (0, 1)")
    print(f"false decisions over {args.streams} streams, alpha = {args.alpha:g}, every look")
    print("| statistic | streams of | looks | anytime-valid | fixed-n, every look |")
    print("|---|---|---|---|---|")
    for row in simulate(args.streams, args.alpha):
        print(
            f"| {row.statistic} | {row.truth} | {row.looks} | {row.anytime:.1%} | {row.fixed:.1%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
