"""Aggregations over a run shared by the HTML report and the rollback comparison.

Everything here reduces a table of any size to a small frame (time buckets, quantiles,
counts), so what reaches a chart or a JSON file stays small however long the run was.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.typing import SeriesGroupBy

from contract import EventKind, Outcome, servers
from contract.seed import SEED
from gates.applicability import available
from gates.keys import distinct_categories, isin, numbered, shared_codes
from gates.metrics import REGISTRY
from gates.metrics_requests import class_priority
from gates.rundir import RunData
from gates.stats import percentile
from gates.terms import GateFilter
from gates.windows import counter_increase, label_value

BUCKETS = 240
DEFAULT_WATERMARKS = SEED.watermarks()
# Pool usage (0..1) under every name a server profile gives it (contract/profiles/).
POOL_USAGE_METRICS = servers.metric_names("kv_usage")
LENGTH_EDGES = (0, 512, 1024, 2048, 4096, 8192, 16384, 32768, np.inf)


def scheduler_config(run: RunData) -> dict[str, Any]:
    target = run.meta.get("target") or {}
    config = target.get("config") if isinstance(target, dict) else None
    return config if isinstance(config, dict) else {}


def bucket_series(
    frame: pd.DataFrame, key: str, t0: float, t1: float, how: str = "max"
) -> pd.DataFrame:
    """Downsample (t, value) rows per `key` into BUCKETS time buckets.

    Returns columns key, x (seconds from t0, bucket middle), value (`how` per bucket).
    """
    if frame.empty:
        return pd.DataFrame(columns=[key, "x", "value"])
    width = max((t1 - t0) / BUCKETS, 1e-9)
    bucket = np.clip(((frame["t"].to_numpy(dtype=float) - t0) // width), 0, BUCKETS - 1).astype(int)
    grouped = frame.assign(bucket=bucket).groupby([key, "bucket"], sort=True)["value"].agg(how)
    out = grouped.reset_index()
    out["x"] = (out["bucket"] + 0.5) * width
    return out[[key, "x", "value"]]


def pool_usage(run: RunData) -> pd.DataFrame:
    """Pool usage ratio per replica over time (samples, else server events), bucketed by max."""
    samples = run.samples[run.samples["metric"].isin(POOL_USAGE_METRICS)]
    if not samples.empty:  # one family only: the first the target exposes
        first = next(m for m in POOL_USAGE_METRICS if samples["metric"].eq(m).any())
        samples = samples[samples["metric"].eq(first)]
    else:
        ev = run.server_events[run.server_events["pool_total_blocks"].gt(0)]
        samples = pd.DataFrame(
            {
                "t": ev["t"],
                "target": ev["replica"],
                "value": ev["pool_used_blocks"] / ev["pool_total_blocks"],
            }
        )
    return bucket_series(samples[["t", "target", "value"]], "target", run.t_start, run.t_end)


def gpu_memory(run: RunData) -> tuple[pd.DataFrame, float | None, str]:
    """GPU memory used (GiB) per target over time: NVML if sampled, else the simulated GPU."""
    for used_name, total_name, source in (
        ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_TOTAL", "NVML"),
        ("kvgate_sim_gpu_memory_used_bytes", "kvgate_sim_gpu_memory_total_bytes", "simulated GPU"),
    ):
        used = run.samples[run.samples["metric"].eq(used_name)]
        if used.empty:
            continue
        scale = 1.0 / 1024 if source == "NVML" else 1.0 / 2**30  # NVML reports MiB
        if source == "NVML" and used["source"].eq("sim_gpu").all():
            # The sampler's fallback: DCGM field names, but the virtual GPU's numbers.
            source = "simulated GPU, sampled as DCGM fields"
        per_t = used.groupby(["target", "t"], sort=False)["value"].sum().reset_index()
        per_t["value"] *= scale
        total = run.samples.loc[run.samples["metric"].eq(total_name), "value"].max()
        cap = float(total) * scale if pd.notna(total) else None
        return bucket_series(per_t, "target", run.t_start, run.t_end), cap, source
    return pd.DataFrame(columns=["target", "x", "value"]), None, ""


def rejection_rug(run: RunData) -> list[tuple[float, float]]:
    """(x, relative weight) of time buckets holding rejected requests."""
    rejected = run.requests.loc[run.requests["outcome"].eq(Outcome.REJECTED), ["t_send"]]
    if rejected.empty:
        return []
    frame = pd.DataFrame({"t": rejected["t_send"], "key": "r", "value": 1.0})
    counts = bucket_series(frame, "key", run.t_start, run.t_end, how="sum")
    peak = float(counts["value"].max())
    return [(float(x), float(v) / peak) for x, v in zip(counts["x"], counts["value"], strict=True)]


def markers(run: RunData) -> list[tuple[float, str]]:
    """Faults and OOMs as (x seconds from start, label)."""
    out = [
        (float(f.t_start) - run.t_start, f"{f.kind} {f.target}")
        for f in run.faults.dropna(subset=["t_start"]).itertuples()
    ]
    ooms = run.server_events[run.server_events["event"].eq(EventKind.OOM)]
    out += [
        (float(t) - run.t_start, f"OOM {r}")
        for t, r in zip(ooms["t"], ooms["replica"], strict=True)
    ][:20]
    return out


def ttft_quantiles(run: RunData) -> pd.DataFrame:
    """p50/p95/p99 TTFT per (traffic class, priority), with counts."""
    columns = ["traffic_class", "priority"]
    rows = run.requests.loc[run.requests["ttft_s"].notna(), [*columns, "ttft_s"]]
    if rows.empty:
        return pd.DataFrame(columns=["group", "p50", "p95", "p99", "n"])
    group = distinct_categories(rows, columns, class_priority)
    grouped = rows["ttft_s"].groupby(group, observed=True)
    out = pd.DataFrame({f"p{q}": _percentile(grouped, q) for q in (50, 95, 99)})
    out["n"] = grouped.size()
    out.index = out.index.astype(str)
    return out.reset_index(names="group")


def _percentile(grouped: SeriesGroupBy, q: float) -> pd.Series:
    """The q-th percentile of each group, by the gates' definition (missing values left out)."""
    return grouped.agg(lambda values: percentile(values.dropna().to_numpy(dtype=float), q))


def release_latencies(run: RunData, flt: GateFilter | None = None) -> pd.DataFrame:
    """Cancel-to-release seconds per cancelled request (value, request_id, detail)."""
    obs = REGISTRY["cancel_release_latency"].compute(run, flt or GateFilter(), {})
    return obs.frame


def tenant_shares(run: RunData) -> pd.DataFrame:
    """Max and p95 pool share per tenant (none for a target without tenants)."""
    if not available(run, "tenant_share"):
        return pd.DataFrame(columns=["tenant", "max", "p95"])
    obs = REGISTRY["tenant_pool_share"].compute(run, GateFilter(), {})
    if obs.n_samples == 0:
        return pd.DataFrame(columns=["tenant", "max", "p95"])
    grouped = obs.frame.groupby("tenant")["value"]
    return pd.DataFrame({"max": grouped.max(), "p95": _percentile(grouped, 95)}).reset_index()


def preempted_fates(run: RunData) -> pd.Series:
    """Outcome counts of the requests the server preempted at least once."""
    ids = (
        run.server_events.loc[run.server_events["event"].eq(EventKind.PREEMPTED), "request_id"]
        .dropna()
        .unique()
    )
    if len(ids) == 0:
        return pd.Series(dtype=float)
    rows = run.requests.loc[isin(run.requests["request_id"], ids), ["outcome"]]
    fates = rows["outcome"].astype(str).value_counts()
    unknown = len(ids) - len(rows)
    if unknown:
        fates["no client record"] = unknown
    return fates


def reservation_error(run: RunData) -> pd.DataFrame:
    """Per admitted request: prompt tokens, tokens reserved at admission, peak tokens used, error.

    error = used / reserved - 1: above 0 the server held more than it reserved (under-estimate).
    """
    ev = run.server_events
    (ids, sent), texts = shared_codes(ev["request_id"], run.requests["request_id"])
    used = ev["used_tokens"].to_numpy(dtype=float)
    mine = (ids >= 0) & ~np.isnan(used)
    admitted = mine & ev["event"].eq(EventKind.ADMITTED).to_numpy()
    admitted &= ev["reserved_tokens"].to_numpy(dtype=float) > 0
    if not admitted.any():
        return pd.DataFrame(columns=["request_id", "prompt", "reserved", "used", "error"])
    # each request's first admission, in the table's order
    at = np.flatnonzero(admitted)
    first = at[numbered(ids[at])[1]]
    peak = np.full(len(texts), np.nan)
    np.fmax.at(peak, ids[mine], used[mine])
    # Request length from the client's record (the server's usage, else the workload's aim);
    # at admission the server may not hold the prompt in KV yet.
    req = run.requests
    length = req["prompt_tokens"].fillna(req["target_prompt_tokens"]).to_numpy(dtype=float)
    known = np.flatnonzero(sent >= 0)
    record = np.full(len(texts), len(sent))
    np.minimum.at(record, sent[known], known)  # the first record of each id wins
    record[record == len(sent)] = -1
    codes = ids[first]
    prompt = np.append(length, np.nan)[record[codes]]  # -1: no record, no length
    out = pd.DataFrame(
        {
            "request_id": ev["request_id"].array.take(first),
            "prompt": pd.Series(prompt).fillna(pd.Series(used[first])).to_numpy(),
            "reserved": ev["reserved_tokens"].to_numpy(dtype=float)[first],
            "used": peak[codes],
        }
    )
    out["error"] = out["used"] / out["reserved"] - 1.0
    return out


def reservation_error_by_length(errors: pd.DataFrame) -> pd.DataFrame:
    if errors.empty:
        return pd.DataFrame(columns=["length", "median", "p95", "under_reserved", "n"])
    labels = [
        f"<{int(hi)}" if np.isfinite(hi) else f">={int(lo)}" for lo, hi in pairwise(LENGTH_EDGES)
    ]
    length = pd.cut(errors["prompt"], bins=list(LENGTH_EDGES), labels=labels, right=False)
    grouped = errors["error"].groupby(length, observed=True)
    out = pd.DataFrame(
        {
            "median": _percentile(grouped, 50),
            "p95": _percentile(grouped, 95),
            "under_reserved": (errors["error"] > 0).groupby(length, observed=True).mean(),
            "n": grouped.size(),
        }
    )
    return out.reset_index(names="length")


def evictions(run: RunData) -> pd.Series:
    """Evictions per reason: increase of kvgate_evictions_total, else preemption reasons."""
    samples = run.samples[run.samples["metric"].eq("kvgate_evictions_total")]
    if not samples.empty:
        inc = counter_increase(samples)
        reason = label_value(inc["labels"], "reason").replace("", "unlabelled")
        counts = inc.groupby(reason)["increase"].sum()
        return counts[counts > 0]
    pre = run.server_events[run.server_events["event"].eq(EventKind.PREEMPTED)]
    return pre["reason"].astype(str).fillna("unknown").value_counts()


def quota_rejections(run: RunData) -> pd.DataFrame:
    """Rejected requests per tenant (rows) and error code (columns)."""
    refused = run.requests["outcome"].eq(Outcome.REJECTED)
    rejected = run.requests.loc[refused, ["tenant", "error_code"]]
    if rejected.empty:
        return pd.DataFrame()
    codes = rejected["error_code"].astype(str).fillna("unknown")
    return pd.crosstab(rejected["tenant"].astype(str), codes)


def rejection_rates(run: RunData) -> pd.DataFrame:
    """Share of requests rejected, per priority, overall and per reason (error code)."""
    req = run.requests
    if req.empty:
        return pd.DataFrame(columns=["priority", "reason", "rate", "n"])
    rejected = req["outcome"].eq(Outcome.REJECTED)
    totals = req.groupby("priority").size()
    by_reason = (
        req[rejected]
        .groupby(["priority", req.loc[rejected, "error_code"].astype(str).fillna("unknown")])
        .size()
    )
    rows = [
        {
            "priority": p,
            "reason": "all",
            "rate": float(rejected[req["priority"].eq(p)].mean()),
            "n": int(n),
        }
        for p, n in totals.items()
    ]
    rows += [
        {"priority": p, "reason": str(r), "rate": float(c) / float(totals[p]), "n": int(totals[p])}
        for (p, r), c in by_reason.items()
    ]
    return pd.DataFrame(rows)
