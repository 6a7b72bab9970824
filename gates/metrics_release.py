"""The release after a cancel: how long a cancelled request's reservation outlived the
cancel, from the `released` event of the replica holding it (or that replica's death), or,
on a server without per-request events, from its release histogram.

The holders are found over integer request codes (gates/keys.py): a soak's tens of millions
of events are joined with its cancels as numpy over integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from contract import EventKind
from contract.enums import DEATH_EVENTS
from gates.keys import in_time, shared_codes
from gates.metrics_requests import REQUEST_FILTERS, ROW_KEYS, _describe, _evidence
from gates.registry import Cause, Observations, metric
from gates.rundir import RunData
from gates.terms import GateFilter
from gates.windows import (
    counter_increase,
    in_intervals,
    label_value,
    replica_deaths,
    resolve_window,
    select,
)

RELEASE_HISTOGRAM = "kvgate_release_latency_seconds_bucket"
# How long after a cancellation a look waits for its release before reading it as missing.
RELEASE_WAIT_S = 10.0


@metric(
    "cancel_release_latency",
    filters=REQUEST_FILTERS,
    unit="s",
    kind="trend",
    timing=True,
    cause=Cause.RELEASE_DEFECT,
    cause_weight=2,  # a late or missing release is the release path itself
    params={"skew_s": 0.5},
)
def cancel_release_latency(
    run: RunData, flt: GateFilter, params: Mapping[str, Any]
) -> Observations:
    """Seconds from a client's cancel to the `released` event for that request, logged by
    the replica that held it (its last admission); a release logged by any other replica
    frees nothing there and does not count."""
    events = run.server_events
    if not events["event"].eq(EventKind.ADMITTED).any():
        return _release_from_histogram(run, flt)
    cancelled = run.requests.loc[run.requests["cancel_at"].notna(), [*ROW_KEYS, "cancel_at"]]
    rows = select(cancelled, run, flt, "cancel_at")
    if isinstance(rows, str):
        return Observations.none(rows)
    (event_ids, row_ids), ids = shared_codes(events["request_id"], rows["request_id"])
    holding = Holding.of(events, event_ids, len(ids))
    kept = row_ids >= 0  # a request id no event names was never admitted (nor are ids missing)
    kept[kept] = holding.admitted[row_ids[kept]]
    rows, row_ids = rows[kept], row_ids[kept]
    if rows.empty:
        return Observations.none(
            f"no cancelled {_describe(flt)} request held a reservation, so release after cancel "
            "cannot be measured; the plan needs cancellations"
        )
    skew_s = float(params["skew_s"])
    cancel_at = rows["cancel_at"].to_numpy(dtype=float)
    first, before = holding.first_release(row_ids, cancel_at, skew_s)
    t_release = pd.Series(first, index=rows.index)
    released_before = t_release.isna() & before
    # A replica that died took its reservations with it: that death is the release.
    unreleased = (t_release.isna() & ~released_before).to_numpy()
    death = pd.Series(np.nan, index=rows.index)
    holders = holding.holder_names()[row_ids[unreleased]]
    death[unreleased] = _death_after(run, events, holders, cancel_at[unreleased], skew_s)
    by_death = t_release.isna() & ~released_before & death.notna()
    never = t_release.isna() & ~released_before & ~by_death
    if run.meta.get("status") == "running" and never.any():
        # Mid-run, a release may still be on its way to the events table: a look leaves out
        # an unreleased cancellation until the events reach RELEASE_WAIT_S past it (a later
        # release still counts at the end, and one that never comes is +inf there).
        horizon = float(events["t"].max()) if not events.empty else -np.inf
        pending = never & (rows["cancel_at"] > horizon - RELEASE_WAIT_S)
        keep = ~pending.to_numpy()
        rows, t_release, death = rows[keep], t_release[keep], death[keep]
        released_before, by_death, never = released_before[keep], by_death[keep], never[keep]
    latency = (t_release.fillna(death) - rows["cancel_at"]).clip(lower=0.0)
    latency = latency.mask(released_before, 0.0).mask(never, np.inf)
    frame = _evidence(rows, latency, "cancel_at")
    frame.loc[by_death.to_numpy(), "detail"] = "freed by the death of its replica"
    frame.loc[never.to_numpy(), "detail"] = "never released: a leaked reservation (+inf)"
    notes = []
    if never.any():
        notes.append(f"{int(never.sum())} cancelled requests were never released (+inf each)")
    if by_death.any():
        notes.append(f"{int(by_death.sum())} cancelled requests were freed by a replica's death")
    elsewhere = holding.released_elsewhere(row_ids)
    if elsewhere:
        notes.append(
            f"{elsewhere} releases of these requests were logged by a replica other "
            "than the one that last admitted them, and free nothing there"
        )
    return Observations(frame=frame, n_samples=len(rows), notes=notes)


@dataclass(frozen=True, slots=True)
class Holding:
    """Who holds each request, over codes (gates/keys.py): per request code, the replica code
    of its last admission that names a replica, the one whose pool holds its blocks (a retry
    elsewhere admits it again; the replica it left freed it or died), -1 for none; whether
    it was admitted at all; and the `released` events, as request and replica codes."""

    holder: np.ndarray  # per request code: a replica code, -1 for none
    admitted: np.ndarray  # per request code
    replicas: pd.Index  # the replicas' names, by code
    released_ids: np.ndarray  # per `released` event, in the table's order
    released_by: np.ndarray
    released_t: np.ndarray

    @classmethod
    def of(cls, events: pd.DataFrame, ids: np.ndarray, n: int) -> Holding:
        """From the server events and their request codes (which run below `n`)."""
        replicas, names = pd.factorize(events["replica"])
        admitted = np.zeros(n, dtype=bool)
        mine = events["event"].eq(EventKind.ADMITTED).to_numpy() & (ids >= 0)
        admitted[ids[mine]] = True
        named = mine & (replicas >= 0)
        at = in_time(ids[named], events["t"].to_numpy(dtype=float)[named], n, last=True)
        holder = np.full(n, -1, dtype=np.int64)
        held = at >= 0
        holder[held] = replicas[named][at[held]]
        release = events["event"].eq(EventKind.RELEASED).to_numpy()
        t = events["t"].to_numpy(dtype=float)[release]
        return cls(holder, admitted, names, ids[release], replicas[release], t)

    def holder_names(self) -> np.ndarray:
        """Per request code, its holder's name (None for none)."""
        names: np.ndarray = np.asarray([*self.replicas, None], dtype=object)[self.holder]
        return names

    def first_release(
        self, row_ids: np.ndarray, cancel_at: np.ndarray, skew_s: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per cancelled request (its code and cancel): the first release its holder logged
        at or after the cancel (less the skew; NaN for none), and whether its holder logged
        any release at all. A request recorded twice counts the cancels of both records: its
        first release after the earlier of them."""
        n = len(self.admitted)
        since = np.full(n, np.nan)  # per request: releases from here on count
        np.fmin.at(since, row_ids, cancel_at - skew_s)
        ids, t = self.released_ids, self.released_t
        known = np.flatnonzero(ids >= 0)
        # the releases its holder logged (a holder without a name: a release without one)
        by_holder = known[self.released_by[known] == self.holder[ids[known]]]
        asked = np.zeros(n, dtype=bool)
        asked[row_ids] = True
        by_holder = by_holder[asked[ids[by_holder]]]
        any_release = np.zeros(n, dtype=bool)
        any_release[ids[by_holder[~np.isnan(t[by_holder])]]] = True
        late = by_holder[t[by_holder] >= since[ids[by_holder]]]
        first = np.full(n, np.nan)
        np.fmin.at(first, ids[late], t[late])
        return first[row_ids], any_release[row_ids]

    def released_elsewhere(self, row_ids: np.ndarray) -> int:
        """How many releases of these requests a replica other than its holder (or an
        unnamed one) logged."""
        judged = np.zeros(len(self.admitted), dtype=bool)
        judged[row_ids] = True
        ids, by = self.released_ids, self.released_by
        known = ids >= 0
        holder = np.where(known, self.holder[ids], -1)
        elsewhere = known & judged[ids] & ((by < 0) | (holder < 0) | (by != holder))
        return int(elsewhere.sum())


def _death_after(
    run: RunData, events: pd.DataFrame, holders: np.ndarray, cancel_at: np.ndarray, skew_s: float
) -> np.ndarray:
    """Per cancelled request (the replica holding it, or None, and its cancel): when that
    replica first died after the cancel (NaN: it did not)."""
    deaths = pd.concat(
        [
            events.loc[events["event"].isin(DEATH_EVENTS), ["replica", "t"]],
            replica_deaths(run.faults)[["target", "t_start"]].rename(
                columns={"target": "replica", "t_start": "t"}
            ),
        ],
        ignore_index=True,
    ).dropna()
    result = np.full(len(holders), np.nan)
    for replica, died in deaths.groupby("replica")["t"]:
        times = np.sort(died.to_numpy(dtype=float))
        mine = np.flatnonzero(holders == replica)
        # the first death at or after each cancel (less the skew)
        at = np.searchsorted(times, cancel_at[mine] - skew_s, side="left")
        found = at < len(times)
        result[mine[found]] = times[at[found]]
    return result


def _release_from_histogram(run: RunData, flt: GateFilter) -> Observations:
    """Fallback without server events: the release histogram, counts at bucket upper bounds."""
    samples = run.samples[run.samples["metric"].eq(RELEASE_HISTOGRAM)]
    if flt.window != "all":
        intervals = resolve_window(run, flt.window)
        if isinstance(intervals, str):
            return Observations.none(intervals)
        samples = samples[in_intervals(samples["t"], intervals)]
    increase = counter_increase(samples)
    if increase.empty:
        return Observations.none("no server events and no kvgate_release_latency_seconds samples")
    increase["le"] = pd.to_numeric(label_value(increase["labels"], "le").replace("+Inf", "inf"))
    cumulative = increase.groupby("le")["increase"].sum().sort_index()
    counts = cumulative.diff().fillna(cumulative).clip(lower=0).round().astype(int)
    if counts.sum() == 0:
        return Observations.none("the release histogram recorded no cancellation in the window")
    bounds = counts.index.to_numpy(dtype=float)
    finite = bounds[np.isfinite(bounds)]
    bounds = np.where(np.isfinite(bounds), bounds, finite.max() * 2 if finite.size else 60.0)
    values = np.repeat(bounds, counts.to_numpy())
    frame = pd.DataFrame({"value": values, "detail": "histogram bucket upper bound"})
    note = (
        "from the kvgate_release_latency_seconds histogram "
        "(upper bounds; class/priority/tenant filters not applied)"
    )
    return Observations(frame=frame, n_samples=len(values), notes=[note])
