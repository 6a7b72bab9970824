"""A capacity run, step by step: offered load, throughput, goodput, latency and refusals.

The step ramp (workloads/shapes.py) records its steps in meta.capacity; each row here is one
step. Goodput is DistServe's: requests per second that were served and met their SLO, the
first token within their class's TTFT limit and each later token within TPOT
(contract.GOODPUT_TTFT_S, GOODPUT_TPOT_S). The capacity gates (gates/capacity.yaml) judge
the highest load that still met the SLO and the goodput there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

import contract
from contract import Outcome, servers
from contract.quantiles import censored_latency
from gates.registry import Cause, Observations, metric
from gates.rundir import RunData
from gates.stats import percentile
from gates.terms import GateFilter


def steps(run: RunData) -> list[dict[str, Any]]:
    cap = run.meta.get("capacity") or {}
    found = cap.get("steps") if isinstance(cap, dict) else None
    return [s for s in found or [] if isinstance(s, dict) and s.get("t0") is not None]


def met_slo(rows: pd.DataFrame) -> pd.Series:
    """Per request: served, within its class's TTFT limit, and within TPOT per later token."""
    limit = rows["priority"].astype(str).map(dict(contract.GOODPUT_TTFT_S)).fillna(np.inf)
    ttft_ok = rows["ttft_s"].le(limit)
    tpot_ok = rows["itl_mean_s"].isna() | rows["itl_mean_s"].le(contract.GOODPUT_TPOT_S)
    return rows["outcome"].eq(Outcome.OK) & ttft_ok & tpot_ok


def curve(run: RunData) -> pd.DataFrame:
    """One row per step: users, seconds, sent, completed/s, goodput/s, TTFT p50/p95 by
    priority (+inf once the server left enough requests unanswered), TPOT mean, pool usage
    (mean), refusals by cause."""
    found = steps(run)
    if not found:
        return pd.DataFrame()
    requests = run.requests
    usage = run.samples[run.samples["metric"].isin(servers.metric_names("kv_usage"))]
    out = []
    for step in found:
        t0 = float(step["t0"])
        t1 = float(step.get("t1") or run.t_end)
        rows = requests[(requests["t_send"] >= t0) & (requests["t_send"] < t1)]
        seconds = max(t1 - t0, 1e-9)
        row: dict[str, Any] = {
            "users": step.get("users"),
            "t0": t0,
            "seconds": round(seconds, 1),
            "sent": len(rows),
            "completed_per_s": float(rows["outcome"].eq(Outcome.OK).sum()) / seconds,
            "goodput_per_s": float(met_slo(rows).sum()) / seconds,
            "tpot_mean_s": float(rows["itl_mean_s"].mean())
            if rows["itl_mean_s"].notna().any()
            else None,
            "pool_usage": _mean_in(usage, t0, t1),
            "refused_capacity": int(step.get("rejected_capacity") or 0),
            "refused_policy": int(step.get("rejected_policy") or 0),
            "timeouts": int(rows["outcome"].eq(Outcome.TIMEOUT).sum()),
        }
        for priority, group in rows.groupby("priority"):
            ttft = _ttft_as_gates_count(group)
            if len(ttft):
                row[f"ttft_p50_{priority}"] = percentile(ttft, 50)
                row[f"ttft_p95_{priority}"] = percentile(ttft, 95)
        out.append(row)
    return pd.DataFrame(out)


def _ttft_as_gates_count(rows: pd.DataFrame) -> list[float]:
    """TTFTs as the ttft gate and the SLO knee count them: +inf for a request the server
    never answered, a client's cancel or a 4xx refusal left out (censored_latency)."""
    columns = ("ttft_s", "outcome", "http_status", "chunks", "max_tokens")
    counted = map(censored_latency, *(rows[c] for c in columns))
    return [value for value in counted if value is not None]


def _mean_in(samples: pd.DataFrame, t0: float, t1: float) -> float | None:
    inside = samples[(samples["t"] >= t0) & (samples["t"] < t1)]
    return float(inside["value"].mean()) if not inside.empty else None


def _good_steps(table: pd.DataFrame, run: RunData) -> pd.DataFrame:
    """Steps below every knee: no capacity refusals past the threshold, SLO held. After a
    bisection, the lowest load that did not hold (`capacity_bound_users`) is the knee."""
    cap = run.meta.get("capacity") or {}
    knees = [
        cap.get(k)
        for k in (
            "rejection_started_users",
            "slo_broken_users",
            "timeouts_started_users",
            "capacity_bound_users",
        )
    ]
    first = min((float(k) for k in knees if isinstance(k, int | float)), default=np.inf)
    return table[table["users"].astype(float) < first]


def _below_knees(run: RunData) -> tuple[pd.DataFrame, int] | str:
    """(the curve's steps below every knee, how many steps there were), or why none."""
    table = curve(run)
    if table.empty:
        return "no capacity steps in meta.capacity (not a step-ramp run)"
    good = _good_steps(table, run)
    if good.empty:
        return "even the first step was past a knee: no load met the SLO"
    return good, len(table)


@metric("capacity_at_slo", filters=(), unit="users", kind="trend", timing=False, cause=Cause.NONE)
def capacity_at_slo(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """The highest load (users) of a step below every knee (capacity refusals, the TTFT SLO,
    timeouts): one row; `min >= N` requires that capacity."""
    found = _below_knees(run)
    if isinstance(found, str):
        return Observations.none(found)
    good, steps_seen = found
    best = good.loc[good["users"].astype(float).idxmax()]
    frame = pd.DataFrame(
        {"value": [float(best["users"])], "t": [float(best["t0"])], "detail": [
            f"{int(best['users'])} users held: {best['completed_per_s']:.2f} completed/s, "
            f"goodput {best['goodput_per_s']:.2f}/s"
        ]}
    )  # fmt: skip
    return Observations(frame=frame, n_samples=steps_seen)


@metric(
    "goodput_at_slo", filters=(), unit="requests/s", kind="trend", timing=False, cause=Cause.NONE
)
def goodput_at_slo(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """The best goodput (requests/s that met their SLO) of the steps below every knee."""
    found = _below_knees(run)
    if isinstance(found, str):
        return Observations.none(found)
    good, steps_seen = found
    best = good.loc[good["goodput_per_s"].idxmax()]
    frame = pd.DataFrame(
        {"value": [float(best["goodput_per_s"])], "t": [float(best["t0"])], "detail": [
            f"at {int(best['users'])} users"
        ]}
    )  # fmt: skip
    return Observations(frame=frame, n_samples=steps_seen)
