"""Facts meta.json records after a run: simulator lag from the samples, versions, hosts.

Simulator lag is the p99 over time of the replicas' `kvgate_step_lag_seconds` histogram:
each scrape interval of each replica is valued by its worst step's bucket (counter resets
after a restart handled), with `kvgate_step_lag_max_seconds` as a fallback when no
histogram was scraped. A replica's own fault windows (paused, killed, restarting) are left
out: a stopped process lags by design, which says nothing about a busy machine.
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
import socket
from typing import Any

import pandas as pd

LAG_BUCKETS = "kvgate_step_lag_seconds_bucket"
LAG_MAX = "kvgate_step_lag_max_seconds"
PACKAGES = ("kvgate", "locust", "gevent", "pydantic", "pandas", "pyarrow", "nvidia-ml-py")


def _le(labels: str) -> float | None:
    for part in labels.split(","):
        if part.startswith("le="):
            return float(part[3:])
    return None


# After a fault's rollback, how long the replica is still catching up (restart, warm-up).
FAULT_SETTLE_S = 3.0


def _interval_worst(
    group: pd.DataFrame, lag_max: float | None, skip: list[tuple[float, float]]
) -> list[float]:
    """One replica's histogram scrapes (`t`, `le`, `value`): for each interval between two
    scrapes in which steps ran, the upper bound of the bucket holding its worst step (s);
    intervals ending inside a `skip` window are left out."""
    table = group.pivot_table(index="t", columns="le", values="value", aggfunc="max")
    table = table.sort_index().sort_index(axis=1).ffill()
    if float("inf") not in table.columns or len(table) < 2:
        return []
    bounds = list(table.columns)
    previous = table.iloc[0]
    worst: list[float] = []
    for t, row in table.iloc[1:].iterrows():
        reset = row[float("inf")] < previous[float("inf")]
        inc = row if reset else row - previous  # a restarted replica counts from zero
        previous = row
        steps = inc[float("inf")]
        if steps <= 0:
            continue  # no step ran (idle, or the replica was stopped): nothing lagged
        if any(lo <= float(t) <= hi for lo, hi in skip):
            continue  # its own fault: the step loop was frozen or restarting
        le = next(b for b in bounds if inc[b] >= steps)
        worst.append(le if le != float("inf") else (lag_max if lag_max is not None else le))
    return worst


def sim_lag_ms(
    samples: pd.DataFrame, faults: pd.DataFrame | None = None
) -> dict[str, float | None]:
    """p99 over time and max of the simulator's step lag, in milliseconds.

    p99 is taken over scrape intervals (every replica's, pooled), each valued by the worst
    step lag in it (its histogram bucket's upper bound), not over steps: a few seconds of CPU
    starvation at a ramp lag every step in them, yet are far fewer than 1% of a run's
    thousands of steps, so a per-step p99 hides exactly the seconds in which requests were
    delayed. "p99 <= bound" then reads: in at most 1% of the run's seconds did any step lag
    more than the bound. Falls back to the max gauge when no histogram was scraped.

    `faults` (the run's faults table) marks each replica's own fault windows, from the
    fault's start to FAULT_SETTLE_S after its rollback, which are left out of the p99."""
    out: dict[str, float | None] = {"p99": None, "max": None}
    if samples.empty:
        return out
    maxima = samples[samples["metric"].eq(LAG_MAX)]["value"]
    if not maxima.empty:
        out["max"] = float(maxima.max()) * 1000.0
    buckets = samples[samples["metric"].eq(LAG_BUCKETS)].copy()
    if buckets.empty:
        out["p99"] = out["max"]
        return out
    buckets["le"] = buckets["labels"].astype(str).map(_le)
    buckets = buckets.dropna(subset=["le"])
    lag_max = out["max"] / 1000.0 if out["max"] is not None else None
    worst: list[float] = []
    for target, group in buckets.groupby("target"):
        worst.extend(_interval_worst(group, lag_max, _fault_windows(faults, str(target))))
    if not worst:
        out["p99"] = 0.0  # histograms scraped, but no step ran between two scrapes
        return out
    worst.sort()
    out["p99"] = worst[max(0, math.ceil(0.99 * len(worst)) - 1)] * 1000.0
    return out


def _fault_windows(faults: pd.DataFrame | None, target: str) -> list[tuple[float, float]]:
    if faults is None or faults.empty:
        return []
    own = faults[faults["target"].astype(str).eq(target) & faults["t_start"].notna()]
    ends = own["t_end"].fillna(own["t_start"])
    return [
        (float(a), float(b) + FAULT_SETTLE_S) for a, b in zip(own["t_start"], ends, strict=True)
    ]


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def harness_version() -> str:
    try:
        return importlib.metadata.version("kvgate")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def host_info() -> dict[str, Any]:
    import os

    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
