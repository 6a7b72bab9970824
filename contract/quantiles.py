"""What a percentile of latencies means in kvgate, defined once for every stage.

A percentile is numpy's default (linear interpolation between order statistics) made safe
for censored observations stored as +inf: one that lands on or interpolates towards +inf is
+inf. A latency that never came counts as +inf when the server failed to answer (it is slower
than any line; an `ok` stream that carried no content is such a failure), and is left out
when the client cancelled first or a 4xx refused it (`censored_latency`). gates/stats.py
computes percentiles over arrays with this definition; the load shapes, which may not
import the gates, use `percentile` here directly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol, SupportsFloat

from contract.enums import FAILED_OUTCOMES, answered_empty


class SortedValues(Protocol):
    """Values sorted ascending that can be counted and indexed: a list, or a numpy array."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> SupportsFloat: ...


def percentile_of_sorted(data: SortedValues, q: float) -> float:
    """The q-th percentile (0..100) of values sorted ascending; NaN when there are none."""
    n = len(data)
    if n == 0:
        return math.nan
    h = (n - 1) * q / 100.0
    lo = math.floor(h)
    frac = h - lo
    a = float(data[lo])
    if frac == 0.0:
        return a
    b = float(data[min(lo + 1, n - 1)])
    if math.isinf(b) or math.isinf(a):
        return b if math.isinf(b) else a
    return a + (b - a) * frac


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) of `values` in any order; NaN when there are none."""
    return percentile_of_sorted(sorted(float(v) for v in values), q)


def censored_latency(
    value: float | None,
    outcome: str,
    http_status: float | None,
    chunks: float | None = None,
    max_tokens: float | None = None,
) -> float | None:
    """One request's latency as a percentile counts it: the measured `value`; +inf when the
    server failed to answer (a failed ending, any 5xx, a 503 refusal included: the server
    could not serve it, or an `ok` whose stream carried no content, `answered_empty`); None,
    left out, when the client cancelled first or a 4xx refused it. A missing value may be
    None or NaN (a table's missing number); without `chunks`, an `ok` is taken as served."""
    if value is not None and not math.isnan(value):
        return float(value)
    if outcome in FAILED_OUTCOMES or (http_status is not None and http_status >= 500):
        return math.inf
    if answered_empty(outcome, chunks, max_tokens):
        return math.inf
    return None
