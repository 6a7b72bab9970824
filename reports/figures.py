"""The report's charts, in the order a reader wants them, each built from reports/analysis.py.

Each builder returns the chart (for the HTML) and its numbers (for report.json). A builder
that draws a gate's line takes the verdict as a `verdict` parameter, so the line is the one
the run was judged by, not a number written here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd

import contract
from gates.rundir import RunData
from gates.stats import percentile
from gates.verdict import Verdict
from reports import analysis, gated
from reports.charts import Band, BarChart, Line, LineChart, Point, Rule, ScatterChart

Figure = tuple[LineChart | BarChart | ScatterChart, dict[str, Any]]
RELEASE_EDGES = (0.0, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, np.inf)
RELEASE_LIMIT_S = contract.CANCEL_RELEASE_P99_S
# Past this many requests under the line the scatter thins them (evenly, in time order), so
# the report's size stays bounded; every request over the line or without a value is drawn.
MAX_POINTS = 4000


def _lines(frame: pd.DataFrame, key: str) -> list[Line]:
    return [
        Line(str(name), part["x"].tolist(), part["value"].tolist())
        for name, part in frame.groupby(key)
    ]


def _fault_rules(run: RunData) -> list[Rule]:
    return [
        Rule(x, label, "#dc2626" if label.startswith("OOM") else "#7c3aed")
        for x, label in analysis.markers(run)
    ]


def pool_usage(run: RunData) -> Figure:
    frame = analysis.pool_usage(run)
    config = analysis.scheduler_config(run)
    rules = []
    # Only the watermarks the target's scheduler keeps, as its profile declares them: another
    # engine (vLLM fills its cache to 100% and preempts) is drawn without lines it never
    # promised to keep.
    for name in run.profile.watermarks:
        value = config.get(name, analysis.DEFAULT_WATERMARKS[name])
        suffix = "" if name in config else " (default)"
        rules.append(Rule(float(value), f"{name.replace('_', ' ')} {value:g}{suffix}", "#ca8a04"))
    chart = LineChart(
        id="pool_usage",
        title="KV pool usage over time",
        x_label="seconds since start (max per bucket)",
        y_label="pool usage ratio",
        lines=_lines(frame, "target"),
        hrules=rules,
        vrules=_fault_rules(run),
        rug=analysis.rejection_rug(run),
        rug_label="rejections",
        empty="no pool usage: no KV-usage gauge samples, no server events with pool sizes",
        caption=("Dashed: watermarks. " if rules else "")
        + "Vertical: faults and OOMs. Red ticks at the foot: rejections.",
    )
    return chart, {"series": frame.to_dict("list")}


def gpu_memory(run: RunData) -> Figure:
    frame, cap, source = analysis.gpu_memory(run)
    chart = LineChart(
        id="gpu_memory",
        title=f"GPU memory over time ({source or 'no source'})",
        x_label="seconds since start (max per bucket)",
        y_label="GiB used",
        lines=_lines(frame, "target"),
        hrules=[Rule(cap, f"capacity {cap:.1f} GiB", "#dc2626")] if cap else [],
        vrules=_fault_rules(run),
        rug=analysis.rejection_rug(run),
        rug_label="rejections",
        empty="no GPU memory samples (neither NVML nor the simulated GPU was sampled)",
    )
    return chart, {"source": source, "capacity_gib": cap, "series": frame.to_dict("list")}


def ttft(run: RunData, verdict: Verdict | None = None) -> Figure:
    q = analysis.ttft_quantiles(run)
    gate = gated.ttft_gate(verdict)
    rules, bold = [], []
    if gate is not None:
        rules = [Rule(gate.threshold.value, f"{gate.gate_id}: {gate.threshold.text}", "#dc2626")]
        bold = [g for g in q["group"].tolist() if gate.covers(*g.split("/", 1))]
    chart = BarChart(
        id="ttft",
        title="TTFT by traffic class and priority (log scale)",
        y_label="seconds (log)",
        categories=q["group"].tolist(),
        groups={name: q[name].tolist() for name in ("p50", "p95", "p99")},
        hrules=rules,
        empty="no request received a first token",
        # Batch TTFTs of tens of seconds would flatten the gated sub-second class on a
        # linear axis; on a log axis every class reads, and the gated one is in bold.
        log=True,
        highlight=bold,
        caption="Bold: the classes the TTFT gate judges; dashed: its line.",
    )
    return chart, {"quantiles": q.to_dict("records")}


def critical_ttft(run: RunData, verdict: Verdict | None = None) -> Figure:
    """Each gated request's TTFT against time since load start, the gate's line, the faults."""
    gate = gated.ttft_gate(verdict)
    frame, origin = gated.ttft_observations(run, gate)
    line = None if gate is None else gate.threshold
    values = frame["value"].to_numpy(dtype=float)
    x = frame["t"].to_numpy(dtype=float) - origin
    finite = np.isfinite(values)
    breach = np.array([line is not None and not line.holds(v) for v in values], dtype=bool)
    under = np.flatnonzero(finite & ~breach)
    if len(under) > MAX_POINTS:
        under = under[np.linspace(0, len(under) - 1, MAX_POINTS).astype(int)]
    keep = np.sort(np.concatenate([under, np.flatnonzero(finite & breach)]))
    ids = frame["request_id"].astype(str).to_numpy()
    points = [
        Point(
            float(x[i]),
            float(values[i]),
            bool(breach[i]),
            f"{ids[i]}: {values[i]:.3f} s at +{x[i]:.1f} s" if breach[i] else "",
        )
        for i in keep
    ]
    censored = [
        Point(float(x[i]), math.inf, True, f"{ids[i]}: no first token, sent at +{x[i]:.1f} s")
        for i in np.flatnonzero(~finite)
    ]
    who = gated.describe_filter(gate)
    rule = None
    if gate is not None and line is not None:
        where = (
            "" if gate.from_verdict else ", from the built-in gates: the verdict has no TTFT gate"
        )
        rule = Rule(line.value, f"{gate.gate_id}: {line.text}{where}", "#dc2626")
    thinned = len(under) < int((finite & ~breach).sum())
    chart = ScatterChart(
        id="critical_ttft",
        title=f"TTFT of each {who} request over time",
        x_label="seconds since load start (send time)",
        y_label="TTFT, seconds (log)",
        points=points,
        line=rule,
        censored=censored,
        censored_label="no first token (a breach)",
        bands=[
            Band(x0 - origin, None if x1 is None else x1 - origin, label)
            for x0, x1, label in gated.fault_spans(run)
        ],
        empty=f"no {who} request was sent in this run",
        caption=(
            "Red: over the gate's line; triangles in the top strip: requests that never got "
            "a first token, counted as breaches. Purple: faults, shaded until they ended."
            + (f" Points under the line thinned to {MAX_POINTS}." if thinned else "")
        ),
    )
    summary = {
        "gate": None if gate is None else gate.gate_id,
        "threshold_s": None if line is None else line.value,
        "threshold_from": None
        if gate is None
        else ("verdict" if gate.from_verdict else "built-in gates"),
        "n": len(values),
        "over_line": int((finite & breach).sum()),
        "no_first_token": int((~finite).sum()),
        "load_start": origin,
    }
    return chart, summary


def release(run: RunData) -> Figure:
    values = analysis.release_latencies(run)["value"].to_numpy(dtype=float)
    counts = np.histogram(values, bins=np.array(RELEASE_EDGES))[0] if len(values) else np.array([])
    labels = [
        f"{lo:g}-{hi:g}s" if np.isfinite(hi) else f">{lo:g}s" for lo, hi in pairwise(RELEASE_EDGES)
    ]
    limit_bin = RELEASE_EDGES.index(RELEASE_LIMIT_S) - 1
    chart = BarChart(
        id="cancel_release",
        title="Cancel-to-release latency",
        y_label="cancelled requests",
        categories=labels if len(values) else [],
        groups={"requests": [float(c) for c in counts]},
        split_after=limit_bin,
        split_label=f"{RELEASE_LIMIT_S:g} s limit",
        empty="no cancelled request held a reservation, so there is no release latency to show",
    )
    summary = {"n": len(values), "bins": labels, "counts": [int(c) for c in counts]}
    if len(values):
        summary |= {
            "p50": percentile(values, 50),
            "p99": percentile(values, 99),
        }
    return chart, summary


def tenant_share(run: RunData) -> Figure:
    shares = analysis.tenant_shares(run)
    cap = float(analysis.scheduler_config(run).get("tenant_max_share", contract.TENANT_MAX_SHARE))
    chart = BarChart(
        id="tenant_share",
        title="Tenant share of the pool against the cap",
        y_label="share of pool",
        categories=shares["tenant"].astype(str).tolist(),
        groups={"max": shares["max"].tolist(), "p95": shares["p95"].tolist()},
        hrules=[Rule(cap, f"hard cap {cap:g}", "#dc2626")],
        empty="no tenant share data (no kvgate_tenant_pool_share samples, no server events)",
    )
    return chart, {"cap": cap, "tenants": shares.to_dict("records")}


def preempted(run: RunData) -> Figure:
    fates = analysis.preempted_fates(run)
    chart = BarChart(
        id="preempted",
        title="What became of preempted requests",
        y_label="requests",
        categories=[str(k) for k in fates.index],
        groups={"requests": [float(v) for v in fates.to_numpy()]},
        empty="no request was preempted in this run",
    )
    return chart, {"fates": {str(k): int(v) for k, v in fates.items()}}


CAPACITY_KNEES = (
    ("rejection_started_users", "capacity refusals started"),
    ("policy_rejection_started_users", "policy refusals started"),
    ("slo_broken_users", "TTFT SLO broken"),
    ("timeouts_started_users", "timeouts started"),
)


def capacity(run: RunData) -> Figure:
    cap = run.meta.get("capacity") or {}
    knees = {key: cap.get(key) for key, _ in CAPACITY_KNEES}
    found = [v for v in knees.values() if isinstance(v, int | float)]
    chart = BarChart(
        id="capacity",
        title="Capacity knees: where refusals (by cause), SLO breaches and timeouts started",
        y_label="concurrent users",
        categories=[label for _, label in CAPACITY_KNEES] if found else [],
        groups={"users": list(knees.values())},
        empty="the load shape did not search for capacity (meta.capacity is empty)",
        caption=(
            "Capacity refusals starting first is the real capacity; a tenant's quota (policy "
            "refusals) is not; timeouts before refusals mean the server queues blindly."
        ),
    )
    return chart, {**knees, "stop_reason": cap.get("stop_reason"), "steps": cap.get("steps")}


def reservation(run: RunData) -> Figure:
    by_length = analysis.reservation_error_by_length(analysis.reservation_error(run))
    chart = BarChart(
        id="reservation_error",
        title="Reservation error by request length (prompt tokens)",
        y_label="used / reserved − 1",
        categories=by_length["length"].astype(str).tolist(),
        groups={"median": by_length["median"].tolist(), "p95": by_length["p95"].tolist()},
        hrules=[Rule(0.0, "reserved = used", "#374151")],
        empty="no admitted request carries reserved and used tokens in the server events",
        caption="Above 0 the server held more than it reserved (an under-estimate: OOM risk).",
    )
    return chart, {"by_length": by_length.astype({"length": str}).to_dict("records")}


def evictions(run: RunData) -> Figure:
    counts = analysis.evictions(run)
    chart = BarChart(
        id="evictions",
        title="Evictions by reason",
        y_label="evictions",
        categories=[str(k) for k in counts.index],
        groups={"evictions": [float(v) for v in counts.to_numpy()]},
        empty="no eviction or preemption was recorded",
    )
    return chart, {"by_reason": {str(k): float(v) for k, v in counts.items()}}


def quota_rejections(run: RunData) -> Figure:
    table = analysis.quota_rejections(run)
    chart = BarChart(
        id="quota_rejections",
        title="Rejections by tenant and reason",
        y_label="rejected requests",
        categories=[str(t) for t in table.index],
        groups={str(c): [float(v) for v in table[c]] for c in table.columns},
        empty="no request was rejected",
    )
    return chart, {
        "by_tenant": {
            str(t): {str(c): int(v) for c, v in row.items()} for t, row in table.iterrows()
        }
    }


FIGURES: tuple[Callable[..., Figure], ...] = (
    pool_usage,
    gpu_memory,
    critical_ttft,
    ttft,
    release,
    tenant_share,
    preempted,
    capacity,
    reservation,
    evictions,
    quota_rejections,
)
