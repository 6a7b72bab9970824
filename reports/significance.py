"""The error rate `kvgate compare` keeps: its level, the exact one-sided test of two failure
rates, and Holm's adjustment over every test one comparison makes (README: How compare
decides)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import boschloo_exact, fisher_exact

ALPHA = 0.01  # family-wise: the chance that identical schedulers are told apart at all
# Boschloo's test enumerates every table of the two sample sizes at each of its nuisance
# points, so its time grows with their product: 200 by 200 takes a fraction of a second,
# 1000 by 1000 several. Beyond this, Fisher's test (a hypergeometric sum) is used: it is as
# exact, and at such sizes nearly as powerful.
BOSCHLOO_MAX_TABLES = 40_000


def worse_rate_p(
    failed_candidate: int, n_candidate: int, failed_baseline: int, n_baseline: int
) -> tuple[float, str]:
    """(p value, test name) of the one-sided exact test that the candidate's failure rate is
    above the baseline's. No failure on either side (or nothing but failures) is no evidence
    of a difference: p = 1 with no test run."""
    for name, failed, n in (
        ("candidate", failed_candidate, n_candidate),
        ("baseline", failed_baseline, n_baseline),
    ):
        if not 0 <= failed <= n or n == 0:
            raise ValueError(f"{name}: {failed} failures of {n} requests is not a rate")
    total = failed_candidate + failed_baseline
    if total == 0 or total == n_candidate + n_baseline:
        return 1.0, "none"
    # columns are the two samples (their sizes fixed by the runs), rows failed / not failed;
    # "greater": the candidate's column has the larger share of failures
    table = np.array(
        [
            [failed_candidate, failed_baseline],
            [n_candidate - failed_candidate, n_baseline - failed_baseline],
        ]
    )
    if n_candidate * n_baseline <= BOSCHLOO_MAX_TABLES:
        return float(boschloo_exact(table, alternative="greater").pvalue), "boschloo"
    return float(fisher_exact(table, alternative="greater").pvalue), "fisher"


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment, in the order given: the i-th smallest of m p values is
    multiplied by m - i + 1, never below the adjusted value before it, never above 1. A test
    whose adjusted p is below ALPHA is rejected with the family-wise error kept at ALPHA,
    whatever the dependence between the tests. A NaN (a test that could not tell) counts as 1."""
    p_values = [p if p == p else 1.0 for p in p_values]
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
