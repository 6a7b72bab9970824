"""Drift over a long run: one value per window, judged by its fitted slope per hour.

A soak exists to find what creeps: memory that does not come back, a server process that
grows, a ledger that drifts, latency or refusals that rise. Each metric here reduces the run
to one row per window (`window_s`, or the plan's troughs where there are any) and the gate
judges the least-squares slope of those rows with its interval (`slope` in gates/estimate.py),
so a single noisy window neither passes nor fails a run; too few windows cannot pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from contract import Outcome, servers
from gates.registry import Cause, Observations, metric
from gates.rundir import RunData
from gates.stats import percentile
from gates.terms import GateFilter
from gates.windows import phases, resolve_window, select

WINDOW_S = 120.0
SERVER_ROLES = ("gateway", "server")  # plus every "replica:<id>"


def _windows(run: RunData, window_s: float, use_troughs: bool) -> list[tuple[float, float]]:
    """The troughs (or idle points) when asked and the shape has them, else fixed windows
    over the load."""
    if use_troughs:
        troughs = [(float(p["t0"]), float(p["t1"])) for p in phases(run) if p["name"] == "trough"]
        if len(troughs) >= 2:
            return troughs
    stress = resolve_window(run, "stress")
    lo, hi = (run.t_start, run.t_end) if isinstance(stress, str) or not stress else stress[0]
    lo, hi = float(lo), float(hi)
    edges = np.arange(lo, hi, window_s)
    return [(float(a), float(min(a + window_s, hi))) for a in edges if hi - a >= window_s / 2]


def _per_window(
    rows: pd.DataFrame,
    spans: list[tuple[float, float]],
    reduce: Callable[[pd.DataFrame], float | None],
    what: str,
) -> Observations:
    values, times, detail, skipped = [], [], [], 0
    for a, b in spans:
        inside = rows[(rows["t"] >= a) & (rows["t"] < b)]
        value = reduce(inside) if not inside.empty else None
        if value is None or not np.isfinite(value):
            skipped += value is not None
            continue
        values.append(float(value))
        times.append((a + b) / 2)
        detail.append(f"{what} {value:.4g} in [{a:.0f}, {b:.0f})")
    if len(values) < 2:
        return Observations.none(
            f"{len(values)} window(s) with {what}; a trend needs two or more (a longer run, "
            "or a shorter params.window_s)"
        )
    frame = pd.DataFrame({"value": values, "t": times, "detail": detail})
    notes = [f"{skipped} window(s) left out: {what} was unbounded there"] if skipped else []
    return Observations(frame=frame, n_samples=len(values), notes=notes)


def _samples(run: RunData, names: tuple[str, ...]) -> pd.DataFrame:
    return run.samples[run.samples["metric"].isin(names)]


@metric(
    "memory_floor",
    filters=(),
    unit="share of capacity",
    kind="series",
    timing=False,
    cause=Cause.NONE,
    params={"window_s": WINDOW_S},
)
def memory_floor(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """The KV pool's lowest usage (share of the pool) in each trough, or in each window of a
    shape without troughs, worst replica: memory that does not come back raises it."""
    used = _samples(run, ("kvgate_pool_used_blocks",))
    total = _samples(run, ("kvgate_pool_blocks_total",)).groupby("target")["value"].max()
    if not used.empty and not total.empty:
        share = used.assign(value=used["value"] / used["target"].map(total))
    else:
        share = _samples(run, servers.metric_names("kv_usage"))
    share = share.dropna(subset=["value"])
    if share.empty:
        return Observations.none("no KV pool usage samples (blocks, or a profile's gauge)")

    def floor(rows: pd.DataFrame) -> float:
        return float(rows.groupby("target")["value"].min().max())

    spans = _windows(run, float(params["window_s"]), use_troughs=True)
    return _per_window(share, spans, floor, "lowest pool usage")


@metric(
    "server_rss",
    filters=(),
    unit="MB",
    kind="series",
    timing=False,
    cause=Cause.NONE,
    params={"window_s": WINDOW_S},
)
def server_rss(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """The server processes' resident memory (MB, all of them summed) per window: a process
    that grows without bound shows as a rising line. Windows a process was missing from (a
    kill, a restart) are left out, so a restart's fresh process does not read as a fall."""
    rss = _samples(run, ("process_rss_bytes",))
    roles = rss["labels"].astype(str).str.removeprefix("role=")
    rss = rss[roles.isin(SERVER_ROLES) | roles.str.startswith("replica:")].assign(role=roles)
    if rss.empty:
        return Observations.none("no RSS samples of a server process (gateway, replicas, pid)")
    every = set(rss["role"])

    def total(rows: pd.DataFrame) -> float | None:
        if set(rows["role"]) != every:
            return None
        return float(rows.groupby("role")["value"].mean().sum() / 1e6)

    spans = _windows(run, float(params["window_s"]), use_troughs=False)
    return _per_window(rss, spans, total, "server RSS (MB)")


@metric(
    "ledger_drift_trend",
    filters=(),
    unit="tokens",
    kind="series",
    timing=False,
    cause=Cause.NONE,
    params={"window_s": WINDOW_S},
)
def ledger_drift_trend(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """The gateway's ledger drift (reserved minus the live reservations, tokens), its largest
    absolute value per window: a ledger that loses track grows it."""
    drift = _samples(run, ("kvgate_gateway_ledger_drift_tokens",))
    if drift.empty:
        return Observations.none("no kvgate_gateway_ledger_drift_tokens samples")
    spans = _windows(run, float(params["window_s"]), use_troughs=False)
    return _per_window(
        drift, spans, lambda rows: float(rows["value"].abs().max()), "largest ledger drift"
    )


@metric(
    "ttft_p95_trend",
    filters=("traffic_class", "priority", "tenant"),
    unit="s",
    kind="series",
    timing=True,
    cause=Cause.NONE,
    params={"window_s": WINDOW_S},
)
def ttft_p95_trend(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """TTFT p95 per window (s) of the answered requests (the availability gate judges the
    unanswered ones; a window whose p95 would reach one is left out and named in the notes)."""
    return _requests_per_window(
        run,
        flt,
        params,
        lambda rows: rows[~rows["outcome"].eq(Outcome.CANCELLED)]["ttft_s"].fillna(np.inf),
        lambda r: percentile(r["value"].to_numpy(dtype=float), 95),
        "TTFT p95 (s)",
    )


@metric(
    "rejection_rate_trend",
    filters=("traffic_class", "priority", "tenant"),
    unit="share",
    kind="series",
    timing=False,
    cause=Cause.NONE,
    params={"window_s": WINDOW_S},
)
def rejection_rate_trend(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """The share of requests refused (429/503) per window: refusals that rise at the same
    load mean capacity leaks away."""
    return _requests_per_window(
        run,
        flt,
        params,
        lambda rows: rows["outcome"].eq(Outcome.REJECTED).astype(float),
        lambda r: float(r["value"].mean()),
        "refused share",
    )


def _requests_per_window(
    run: RunData,
    flt: GateFilter,
    params: Mapping[str, Any],
    value: Callable[[pd.DataFrame], pd.Series],
    reduce: Callable[[pd.DataFrame], float | None],
    what: str,
) -> Observations:
    """A per-window reduction of the filtered requests' `value` (NaN rows left out)."""
    rows = select(run.requests, run, flt, "t_send")
    if isinstance(rows, str):
        return Observations.none(rows)
    values = value(rows)
    rows = rows.loc[values.index].assign(t=rows["t_send"], value=values)
    spans = _windows(run, float(params["window_s"]), use_troughs=False)
    return _per_window(rows, spans, reduce, what)
