"""Time windows and record filters shared by the metrics.

Windows come from meta.json (`windows`, `phases`) and the faults table; a window the run
did not record is reported as missing data, not widened to the whole run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from contract import FaultEffect, Outcome
from contract.enums import BROKEN_OUTCOMES
from gates.categories import per_category
from gates.keys import numbered, pair_codes, text_codes
from gates.rundir import RunData
from gates.terms import GateFilter

Intervals = list[tuple[float, float]]
# The client's view of a connection that broke or stalled (no server's answer in it).
NETWORK_EFFECTS = tuple(str(effect) for effect in FaultEffect if effect.on_network)


def resolve_window(run: RunData, window: str) -> Intervals | str:
    """The intervals of a named window, or a sentence saying why the run has none."""
    t1 = run.t_end
    if window == "all":
        return [(-np.inf, np.inf)]
    if window in ("stress", "idle_before", "after_load"):
        windows = run.meta.get("windows") or {}
        span = windows.get(window) if isinstance(windows, dict) else None
        if not span or len(span) != 2 or span[0] is None or span[1] is None:
            return f"meta.windows.{window} is absent, so nothing can be judged in that window"
        return [(float(span[0]), float(span[1]))]
    if window.startswith("phase:"):
        name = window.split(":", 1)[1]
        spans = [(float(p["t0"]), float(p["t1"])) for p in phases(run) if p.get("name") == name]
        return spans or f"meta.phases has no phase named {name!r}"
    faults = run.faults.dropna(subset=["t_start"]).sort_values("t_start")
    if faults.empty:
        return "the run injected no fault (faults table empty)"
    if window == "after_fault":
        return [(float(faults["t_start"].iloc[0]), max(t1, float(faults["t_start"].max())))]
    ends = faults["t_end"].fillna(t1)
    spans = [(float(a), float(b)) for a, b in zip(faults["t_start"], ends, strict=True) if b >= a]
    return spans or "no fault has an end at or after its start"


def process_faults(faults: pd.DataFrame) -> pd.DataFrame:
    """Fault rows that took effect (t_start set) in or on a server's process: every effect
    but the network's (kvgate's proxy sits in front of the target, not in it). A fault whose
    effect is `none` is one too: a CONT, a HUP or a command may still upset the process."""
    network = faults["effect"].isin(NETWORK_EFFECTS)
    return faults[faults["t_start"].notna() & ~network]


def replica_deaths(faults: pd.DataFrame) -> pd.DataFrame:
    """Fault rows after which their target's process is gone (its reservations die with it):
    effect `kills` (a kill, a signal KILL or TERM, a command that declares it kills and exited
    0). `target` names the dead replica as the plan named it."""
    return faults[faults["t_start"].notna() & faults["effect"].eq(FaultEffect.KILLS)]


def connection_breaks(faults: pd.DataFrame, t_end: float) -> Intervals:
    """When connections were being reset or stalled in the traffic's path (effect
    `breaks_connections`: a reset_peer or timeout toxic on kvgate's proxy): the span of each
    such fault, open ones until `t_end`."""
    breaks = faults["effect"].eq(FaultEffect.BREAKS_CONNECTIONS)
    breaking = faults[faults["t_start"].notna() & breaks]
    ends = breaking["t_end"].fillna(t_end)
    return [(float(a), float(b)) for a, b in zip(breaking["t_start"], ends, strict=True)]


def broken_by_network(run: RunData, rows: pd.DataFrame, slack_s: float) -> pd.Series:
    """Requests whose connection broke or stalled (BROKEN_OUTCOMES, or an error with no HTTP
    status) while in flight during a connection break: the injected fault, not the server."""
    spans = connection_breaks(run.faults, run.t_end)
    if not spans:
        return pd.Series(False, index=rows.index)
    broken = rows["outcome"].isin(BROKEN_OUTCOMES) | (
        rows["outcome"].eq(Outcome.ERROR) & rows["http_status"].isna()
    )
    t0 = rows["t_send"].to_numpy(dtype=float)
    t1 = t0 + rows["e2e_s"].fillna(0.0).to_numpy(dtype=float) + slack_s
    during = np.zeros(len(rows), dtype=bool)
    for lo, hi in spans:
        during |= (t0 <= hi) & (t1 >= lo)
    return broken & pd.Series(during, index=rows.index)


def phases(run: RunData) -> list[dict[str, float | str]]:
    raw = run.meta.get("phases") or []
    return [p for p in raw if isinstance(p, dict) and {"name", "t0", "t1"} <= set(p)]


def in_intervals(times: pd.Series, intervals: Intervals) -> np.ndarray:
    """Boolean mask of `times` falling in any closed interval."""
    values = times.to_numpy(dtype=float, na_value=np.nan)
    mask = np.zeros(len(values), dtype=bool)
    for lo, hi in intervals:
        mask |= (values >= lo) & (values <= hi)
    return mask


def select(
    frame: pd.DataFrame,
    run: RunData,
    flt: GateFilter,
    time_column: str,
    *,
    class_column: str | None = "traffic_class",
) -> pd.DataFrame | str:
    """Rows of `frame` matching the filter (class, priority, tenant, window)."""
    mask = select_mask(frame, run, flt, time_column, class_column=class_column)
    if isinstance(mask, str):
        return mask
    return frame[mask] if not mask.all() else frame


def select_mask(
    frame: pd.DataFrame,
    run: RunData,
    flt: GateFilter,
    time_column: str,
    *,
    class_column: str | None = "traffic_class",
) -> np.ndarray | str:
    """`select`'s rows as a mask over `frame`, or why the run has none."""
    mask = np.ones(len(frame), dtype=bool)
    if flt.traffic_class and class_column:
        mask &= frame[class_column].isin(flt.traffic_class).to_numpy()
    if flt.priority:
        mask &= frame["priority"].isin(flt.priority).to_numpy()
    if flt.tenant:
        mask &= frame["tenant"].isin(flt.tenant).to_numpy()
    if flt.window != "all":
        intervals = resolve_window(run, flt.window)
        if isinstance(intervals, str):
            return intervals
        mask &= in_intervals(frame[time_column], intervals)
    return mask


def label_value(labels: pd.Series, key: str) -> pd.Series:
    """The value of `key` in canonical "k=v,k=v" label strings ("" when absent)."""

    def extract(text: pd.Series) -> pd.Series:
        found = text.astype("string").str.extract(rf"(?:^|,){key}=([^,]*)", expand=False)
        return found.fillna("").astype(object)

    return per_category(labels, extract)


def counter_increase(samples: pd.DataFrame) -> pd.DataFrame:
    """Per (target, labels) series of a counter: its increase over the rows, counting resets.
    A null reading is no reading: each value is compared with the last non-null one before
    it, so an increase that straddles a failed scrape is still counted.

    Returns columns target, labels, increase, t_first (first time it rose).
    """
    samples = samples[samples["value"].notna()]
    if samples.empty:
        return pd.DataFrame(columns=["target", "labels", "increase", "t_first"])
    ordered = samples.sort_values(["target", "labels", "t"], kind="stable")
    # A series is a (target, labels) pair, numbered over integer codes; a row missing either
    # belongs to no series (it starts afresh and is counted in none).
    target, labels = text_codes(ordered["target"]), text_codes(ordered["labels"])
    named = (target >= 0) & (labels >= 0)
    key = pair_codes(target, labels, int(labels.max(initial=-1)) + 1)
    value = ordered["value"].to_numpy(dtype=float)
    diff = np.diff(value, prepend=np.nan)
    first = ~named | np.concatenate([[True], (key[1:] != key[:-1]) | ~named[:-1]])
    step = np.where(first, 0.0, np.where(diff < 0, value, diff))
    series, at = numbered(key[named])
    total = pd.Series(step[named]).groupby(series, sort=False).sum()
    rose = step[named] > 0
    t = ordered["t"].to_numpy(dtype=float)[named]
    t_first = pd.Series(t[rose]).groupby(series[rose], sort=False).min()
    rows = np.flatnonzero(named)[at]
    return pd.DataFrame(
        {
            "target": ordered["target"].iloc[rows].astype(str).to_numpy(),
            "labels": ordered["labels"].iloc[rows].astype(str).to_numpy(),
            "increase": total.to_numpy(),
            "t_first": t_first.reindex(range(len(at))).to_numpy(),
        }
    )
