"""Facts meta.json records after a run: simulator lag from the samples, versions, hosts.

Simulator lag is the p99 of the replicas' `kvgate_step_lag_seconds` histogram over the run
(counter increases summed across replicas, counter resets after a restart handled), with
`kvgate_step_lag_max_seconds` as a fallback when no histogram was scraped.
"""

from __future__ import annotations

import importlib.metadata
import platform
import socket
from typing import Any

import pandas as pd

LAG_BUCKETS = "kvgate_step_lag_seconds_bucket"
LAG_MAX = "kvgate_step_lag_max_seconds"
PACKAGES = ("kvgate", "locust", "gevent", "pydantic", "pandas", "pyarrow", "nvidia-ml-py")


def _increase(values: pd.Series) -> float:
    """Increase of a counter over time, counting a drop as a reset to zero."""
    total, previous = 0.0, None
    for value in values:
        if previous is not None:
            total += value - previous if value >= previous else value
        previous = value
    return total


def _le(labels: str) -> float | None:
    for part in labels.split(","):
        if part.startswith("le="):
            return float(part[3:])
    return None


def sim_lag_ms(samples: pd.DataFrame) -> dict[str, float | None]:
    """p99 (histogram upper bound) and max of the simulator's step lag, in milliseconds."""
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
    buckets = buckets.dropna(subset=["le"]).sort_values("t")
    per_le: dict[float, float] = {}
    for (_, le), group in buckets.groupby(["target", "le"]):
        per_le[float(le)] = per_le.get(float(le), 0.0) + _increase(group["value"])
    total = per_le.get(float("inf"), max(per_le.values(), default=0.0))
    if total <= 0:
        out["p99"] = 0.0  # histograms scraped, but no step ever lagged into a bucket
        return out
    for le in sorted(per_le):
        if per_le[le] >= 0.99 * total:
            out["p99"] = (le if le != float("inf") else (out["max"] or 0.0) / 1000.0) * 1000.0
            break
    return out


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
