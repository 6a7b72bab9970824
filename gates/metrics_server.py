"""Metrics over server events, samples and faults: OOM, tenant share, memory, failover, batch.

Violation-style metrics return one row per violation (judge them with `count == 0`) and
count what they examined in `n_samples`, so an empty table is "no data", not "no breach".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import beta

from contract import EventKind, Outcome, servers
from contract.enums import LIFECYCLE_EVENTS
from gates import stats
from gates.categories import per_category
from gates.keys import isin, numbered, pair_codes, shared_codes, text_codes
from gates.metrics_requests import DEATH_SLACK_S, EVENT_KEYS, RECORD_COLUMNS
from gates.registry import Cause, Observations, metric
from gates.rundir import RunData
from gates.terms import GateFilter
from gates.windows import (
    counter_increase,
    in_intervals,
    label_value,
    phases,
    process_faults,
    replica_deaths,
    resolve_window,
    select,
)

OOM_REASON = r"(?i)\boom\b|out of memory"
# Everything after an OOM (rejections while replicas restart, slow first tokens) is its
# consequence, so a new OOM outweighs all the other signals of a rollback's cause together.
OOM_WEIGHT = 10
# How far past a peak's end the server's events must reach before a look reads what was
# admitted in it: a poll returns every event up to its own time, and the events sampler
# polls every 0.5 s in the shipped plans. (A look at a boundary reads the tables a second
# or two after it began, once its process has started.)
EVENTS_CATCH_UP_S = 1.0
MEMORY_FAMILIES = (
    ("GPU memory (NVML)", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_TOTAL"),
    (
        "GPU memory (simulated)",
        "kvgate_sim_gpu_memory_used_bytes",
        "kvgate_sim_gpu_memory_total_bytes",
    ),
    ("KV pool blocks", "kvgate_pool_used_blocks", "kvgate_pool_blocks_total"),
    # A server's own KV-usage gauge (contract/profiles/), already a share of its pool.
    *(
        (f"KV cache usage ({name})", name, None)
        for name in servers.metric_names("kv_usage")
        if not name.startswith("kvgate_")  # the reference pool is read in blocks, above
    ),
)


def _rows(value: Any, t: Any, replica: Any, detail: Any, **extra: Any) -> pd.DataFrame:
    return pd.DataFrame({"value": value, "t": t, "replica": replica, "detail": detail, **extra})


@metric(
    "oom_events",
    filters=("window",),
    unit="count",
    kind="count",
    timing=False,
    cause=Cause.ESTIMATION_BIAS,
    cause_weight=OOM_WEIGHT,
)
def oom_events(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """OOM signals: `oom` events, replica deaths blamed on OOM, increases of kvgate_oom_total,
    and answers whose error names an out-of-memory (how any server shows one to a client).
    Every event, counter sample and request in the window is examined."""
    events = select(
        run.server_events[["t", "replica", "event", "reason"]], run, flt, "t", class_column=None
    )
    if isinstance(events, str):
        return Observations.none(events)
    samples = run.samples[run.samples["metric"].eq("kvgate_oom_total")]
    samples = select(samples, run, GateFilter(window=flt.window), "t", class_column=None)
    answers = select(
        run.requests[["t_send", "replica", "error_message"]],
        run,
        GateFilter(window=flt.window),
        "t_send",
        class_column=None,
    )
    assert not isinstance(samples, str) and not isinstance(answers, str)  # same window
    if events.empty and samples.empty and answers.empty:
        return Observations.none(
            "no server events, kvgate_oom_total samples or requests in the window"
        )
    said_oom = answers[per_category(answers["error_message"], _names_oom)]
    oom_reason = per_category(events["reason"], _names_oom)
    died = events["event"].eq(EventKind.REPLICA_DIED) & oom_reason
    hits = events[events["event"].eq(EventKind.OOM) | died]
    parts = [
        _rows(
            1.0,
            hits["t"],
            hits["replica"],
            hits["event"].astype(str) + ": " + hits["reason"].astype(str).fillna(""),
        )
    ]
    increases = counter_increase(samples)
    increases = increases[increases["increase"] > 0]
    nulls = int(samples["value"].isna().sum())
    if not increases.empty:
        detail = "kvgate_oom_total rose by " + increases["increase"].map("{:g}".format)
        parts.append(
            _rows(increases["increase"], increases["t_first"], increases["target"], detail)
        )
    if not said_oom.empty:
        detail = "answered: " + said_oom["error_message"].astype(str).str.slice(0, 160)
        parts.append(_rows(1.0, said_oom["t_send"], said_oom["replica"], detail))
    died = _unexplained_deaths(run, flt)
    if not died.empty:
        detail = (
            "server process "
            + died["target"].astype(str)
            + (" died outside any injected fault (an OOM or a crash)")
        )
        parts.append(_rows(1.0, died["t"], "server", detail))
    frame = pd.concat(parts, ignore_index=True)
    notes = []
    if nulls:
        notes.append(
            f"{nulls} kvgate_oom_total readings were null and left out: each increase is taken "
            "from the last reading before them"
        )
    if events.empty and samples.empty:
        notes.append(
            "judged from the server's answers alone: this target showed no OOM events or "
            "counters, so an OOM that only restarts the server shows as failed requests "
            "(the availability gate)"
        )
    return Observations(
        frame=frame, n_samples=len(events) + len(samples) + len(answers), notes=notes
    )


def _names_oom(text: pd.Series) -> pd.Series:
    """Whether each text names an out-of-memory (OOM_REASON); False where missing."""
    named: pd.Series = text.astype("string").str.contains(OOM_REASON, regex=True, na=False)
    return named


def _unexplained_deaths(run: RunData, flt: GateFilter) -> pd.DataFrame:
    """`process_died` samples of the watched server process (an external target's `pid` or
    `pidfile`) that no injected process fault explains: within [start - 1 s, end + 3 s]."""
    samples = run.samples
    died = samples[samples["metric"].eq("process_died") & samples["labels"].eq("role=server")]
    died = select(died, run, GateFilter(window=flt.window), "t", class_column=None)
    assert not isinstance(died, str)
    if died.empty:
        return died
    faults = process_faults(run.faults)
    spans = [
        (float(a) - 1.0, float(b if pd.notna(b) else run.t_end) + DEATH_SLACK_S)
        for a, b in zip(faults["t_start"], faults["t_end"], strict=True)
    ]
    return died[~in_intervals(died["t"], spans)] if spans else died


@metric(
    "tenant_pool_share",
    filters=("tenant", "window"),
    unit="fraction",
    kind="trend",
    timing=False,
    cause=Cause.PRIORITY_RULES,
)
def tenant_pool_share(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """Each tenant's share of a replica's KV pool over time (samples, else rebuilt from events)."""
    samples = run.samples[run.samples["metric"].eq("kvgate_tenant_pool_share")]
    nulls = int(samples["value"].isna().sum())
    samples = samples[samples["value"].notna()]
    if not samples.empty:
        frame = _rows(
            samples["value"].to_numpy(dtype=float),
            samples["t"].to_numpy(dtype=float),
            samples["target"].to_numpy(),
            "kvgate_tenant_pool_share",
            tenant=label_value(samples["labels"], "tenant").to_numpy(),
        )
        notes = []
    else:
        frame = _share_from_events(run.server_events)
        notes = ["rebuilt from server events (blocks held per request)"]
    if nulls:
        notes.append(f"{nulls} null kvgate_tenant_pool_share samples left out (no reading)")
    if frame.empty:
        return Observations.none(
            "no kvgate_tenant_pool_share samples and no server events with blocks"
        )
    chosen = select(frame, run, flt, "t", class_column=None)
    if isinstance(chosen, str):
        return Observations.none(chosen)
    if chosen.empty:
        return Observations.none("no tenant share observation matches the filter")
    return Observations(frame=chosen.reset_index(drop=True), n_samples=len(chosen), notes=notes)


def _share_from_events(events: pd.DataFrame) -> pd.DataFrame:
    """Blocks held per tenant after every event, divided by the replica's pool size.

    A replica that dies (or restarts) takes every reservation with it, so each replica's
    accounting starts again at its lifecycle rows: a killed replica's requests must not be
    held against their tenants on the restarted one.
    """
    ordered = events.sort_values(["replica", "t", "seq"], kind="stable")
    lifecycle = ordered["event"].isin(LIFECYCLE_EVENTS).astype(int)
    epoch = lifecycle.groupby(ordered["replica"], sort=False).cumsum()
    keep = ordered["request_id"].notna() & ordered["pool_total_blocks"].gt(0)
    ev, epoch = ordered[keep], epoch[keep]
    if ev.empty:
        return pd.DataFrame()
    held = ev["blocks"].where(~ev["event"].eq(EventKind.RELEASED), 0.0).fillna(0.0)
    request = text_codes(ev["request_id"])  # grouped as integers, not as a categorical
    previous = held.groupby([ev["replica"], epoch, request], sort=False).shift(fill_value=0.0)
    delta = held - previous
    tenant_blocks = delta.groupby([ev["replica"], epoch, ev["tenant"]], sort=False).cumsum()
    share = tenant_blocks / ev["pool_total_blocks"]
    detail = "rebuilt from events: " + tenant_blocks.round().astype(int).astype(str) + " blocks"
    return _rows(
        share, ev["t"], ev["replica"], detail, tenant=ev["tenant"], request_id=ev["request_id"]
    )


def _level_windows(run: RunData) -> tuple[tuple[float, float], tuple[float, float]] | str:
    windows = run.meta.get("windows") or {}
    stress = windows.get("stress")
    idle = windows.get("idle_before") or ([run.t_start, stress[0]] if stress else None)
    after = windows.get("after_load") or ([stress[1], run.t_end] if stress else None)
    if not idle or not after:
        return "meta.windows has neither idle_before/after_load nor a stress window to derive them"
    mid = (float(after[0]) + float(after[1])) / 2  # judge the settled second half of the window
    return (float(idle[0]), float(idle[1])), (mid, float(after[1]))


@metric(
    "memory_return",
    filters=(),
    unit="fraction",
    kind="trend",
    timing=False,
    cause=Cause.RELEASE_DEFECT,
    cause_weight=2,  # memory that stays held after the load is what a release defect leaves
)
def memory_return(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """Memory still above its idle level after load, as a fraction of capacity, per target."""
    spans = _level_windows(run)
    if isinstance(spans, str):
        return Observations.none(spans)
    idle, after = spans
    parts = []
    for family, used_name, total_name in MEMORY_FAMILIES:
        used = run.samples[run.samples["metric"].eq(used_name)]
        if used.empty:
            continue
        per_t = used.groupby(["target", "t"], sort=False)["value"].sum().reset_index()
        idle_level = per_t[in_intervals(per_t["t"], [idle])].groupby("target")["value"].median()
        after_level = per_t[in_intervals(per_t["t"], [after])].groupby("target")["value"].median()
        if total_name is None:  # a usage share: its capacity is 1
            capacity = pd.Series(1.0, index=after_level.index)
        else:
            totals = run.samples[run.samples["metric"].eq(total_name)]
            capacity = (
                totals.groupby("target")["value"]
                .max()
                .reindex(after_level.index)
                .fillna(per_t.groupby("target")["value"].max())
            )
        excess = ((after_level - idle_level) / capacity.replace(0, np.nan)).dropna()
        if excess.empty:
            continue
        detail = [
            f"{family}: idle {idle_level[t]:.4g}, after load {after_level[t]:.4g} "
            f"(capacity {capacity[t]:.4g})"
            for t in excess.index
        ]
        parts.append(_rows(excess.to_numpy(), after[0], excess.index.to_numpy(), detail))
    if not parts:
        return Observations.none("no memory samples both in the idle window and after load")
    frame = pd.concat(parts, ignore_index=True)
    return Observations(frame=frame, n_samples=len(frame))


@metric(
    "failover_integrity",
    filters=("window",),
    unit="count",
    kind="count",
    timing=False,
    cause=Cause.RELEASE_DEFECT,
    params={"grace_s": 2.0},
)
def failover_integrity(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """Violations after replica kills: a request held on two replicas; ledger drift not 0."""
    kills = replica_deaths(run.faults)
    if kills.empty:
        return Observations.none(
            "no replica was killed in this run (no fault with effect `kills` took effect: a "
            "kill, a signal KILL or TERM, or a command that declares `effect: kills`)"
        )
    intervals = resolve_window(run, flt.window)
    if isinstance(intervals, str):
        return Observations.none(intervals)
    events = run.server_events
    drift = run.samples[run.samples["metric"].eq("kvgate_gateway_ledger_drift_tokens")]
    if events.empty and drift.empty:
        return Observations.none(
            "no server events and no kvgate_gateway_ledger_drift_tokens samples"
        )
    parts = [
        _double_holds(events, kills, run.t_end),
        _drift_after(drift, kills, float(params["grace_s"])),
    ]
    parts = [p[in_intervals(p["t"], intervals)] for p in parts]
    notes = (
        []
        if not drift.empty
        else ["no ledger drift samples: only double reservations were checked"]
    )
    frame = pd.concat([p for p in parts if not p.empty] or [parts[0]], ignore_index=True)
    return Observations(frame=frame, n_samples=len(kills), notes=notes)


def _double_holds(all_events: pd.DataFrame, kills: pd.DataFrame, t_end: float) -> pd.DataFrame:
    """Requests whose held intervals on two replicas overlap."""
    holding = all_events["event"].isin((EventKind.ADMITTED, EventKind.RESUMED))
    holding &= all_events["request_id"].notna()
    held = all_events.loc[holding, ["request_id", "replica", "t"]]
    held = held[_on_two_replicas(held)]
    twice = held["request_id"].unique()
    # the few requests held on two replicas, as text from here: their replicas are matched
    # with the faults' targets, and their ids sorted as text
    held = held.astype({"request_id": str, "replica": str})
    starts = (
        held.groupby(["request_id", "replica"], sort=False)["t"].min().rename("start").reset_index()
    )
    per_request = starts.groupby("request_id")["replica"].transform("size")
    starts = starts[per_request > 1]
    if starts.empty:
        return _rows([], [], [], [], request_id=[])
    released = all_events[
        all_events["event"].eq(EventKind.RELEASED) & isin(all_events["request_id"], twice)
    ]
    released = released.astype({"request_id": str, "replica": str})
    ends = released.groupby(["request_id", "replica"])["t"].max()
    ends = ends.rename("released")
    starts = starts.join(ends, on=["request_id", "replica"])
    deaths = pd.concat(
        [
            all_events.loc[all_events["event"].eq(EventKind.REPLICA_DIED), ["replica", "t"]].astype(
                {"replica": str}
            ),
            kills.rename(columns={"target": "replica", "t_start": "t"})[["replica", "t"]],
        ]
    ).sort_values("t")
    starts = pd.merge_asof(
        starts.sort_values("start"),
        deaths.rename(columns={"t": "died"}),
        left_on="start",
        right_on="died",
        by="replica",
        direction="forward",
    )
    end = starts["released"].where(starts["released"] >= starts["start"])
    starts["end"] = end.fillna(starts["died"]).fillna(t_end)
    starts = starts.sort_values(["request_id", "start"])
    prior_end = starts.groupby("request_id")["end"].cummax().groupby(starts["request_id"]).shift()
    prior_replica = starts.groupby("request_id")["replica"].shift()
    bad = starts[starts["start"] < prior_end]
    if bad.empty:
        return _rows([], [], [], [], request_id=[])
    detail = (
        "held on "
        + prior_replica[bad.index].astype(str)
        + " until "
        + prior_end[bad.index].map("{:.3f}".format)
        + " while admitted on "
        + bad["replica"].astype(str)
    )
    return _rows(1.0, bad["start"], bad["replica"], detail, request_id=bad["request_id"])


def _on_two_replicas(held: pd.DataFrame) -> np.ndarray:
    """The rows of `held` whose request is held on two replicas or more."""
    ids, replicas = text_codes(held["request_id"]), text_codes(held["replica"])
    named = replicas >= 0
    n = int(replicas.max(initial=-1)) + 1
    pairs = pair_codes(ids[named], replicas[named], n)
    pairs = pairs[numbered(pairs)[1]]  # each distinct (request, replica) once
    replicas_of = np.bincount(pairs // (n + 1), minlength=int(ids.max(initial=-1)) + 2)
    several: np.ndarray = replicas_of[ids + 1] > 1  # pair codes count a missing id as 0
    return several


def _drift_after(drift: pd.DataFrame, kills: pd.DataFrame, grace_s: float) -> pd.DataFrame:
    """Per kill and gateway: a violation when drift is still non-zero after `grace_s`.

    Drift is transiently non-zero in normal operation (ledger and replicas update at
    slightly different moments), so one sample proves nothing: the kill is a violation
    when every sample of the settling window [kill + grace, + max(3 scrapes, grace)] is
    non-zero, i.e. the ledger did not come back to the sum of live reservations.
    """
    rows = []
    for target, series in drift.sort_values("t").groupby("target"):
        t = series["t"].to_numpy(dtype=float)
        value = series["value"].to_numpy(dtype=float)
        scrape = float(np.median(np.diff(t))) if len(t) > 1 else 0.0
        for t_kill, fault in zip(kills["t_start"], kills["fault_id"], strict=True):
            lo = float(t_kill) + grace_s
            hi = lo + max(3 * scrape, grace_s)
            window = (t >= lo) & (t <= hi)
            if not window.any():  # no scrape in the window: judge by the next one
                window = t == t[t >= lo][0] if (t >= lo).any() else window
            if not window.any() or (value[window] == 0).any():
                continue
            worst = float(np.abs(value[window]).max())
            detail = (
                f"ledger drift non-zero (up to {worst:g} tokens) in all {int(window.sum())} "
                "samples "
                f"{grace_s:g}-{hi - t_kill:.1f}s after fault {fault}"
            )
            rows.append((worst, float(t[window][0]), target, detail))
    return _rows(*zip(*rows, strict=True)) if rows else _rows([], [], [], [])


@metric(
    "batch_peak_trough",
    filters=("tenant",),
    unit="count",
    kind="count",
    timing=False,
    cause=Cause.PRIORITY_RULES,
    params={"peak_ratio_max": 0.2, "starve_after_s": 5.0, "settle_s": 1.0},
)
def batch_peak_trough(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """Phases where batch admission misbehaved: admitting at peak, or starving in a trough.

    Judged per offered request, so the load shape cannot decide it: a peak breaches when
    the share of batch requests sent in it that were admitted before it ended is above
    `peak_ratio_max` x the same share in the troughs, with 95% confidence (Clopper-Pearson
    interval of the peak's share); a peak whose counts cannot tell either way, or that was
    offered no batch work at all, is unsure. A trough starves when batch requests were
    waiting in it for `starve_after_s` or more — sent, neither admitted nor ended before —
    and it admitted none. An empty queue is no starvation, and a refused request waits no
    more (`_stopped_waiting`): refusals at a peak leave an idle trough idle.

    A peak whose own interval straddles the line is unsure unless all the peaks read
    together are clearly under it.

    Batch requests sent in the first `settle_s` of a phase count in neither share: the change
    of phase takes a few scheduler steps (trough-only work ends and frees its room before the
    peak's online requests have reached the replicas), and a request that slips in then says
    nothing about how the queue behaves once the phase has begun.

    While the load runs (a look: meta.status "running"), only whole phases are read (the
    phase still going on is `open`), and a peak's batch requests still in flight count by
    the server's events (arrived in the peak, admitted before its end or not).
    """
    running = run.meta.get("status") == "running"
    spans = [p for p in phases(run) if not p.get("open")]  # a look reads whole phases only
    peaks = [p for p in spans if p["name"] == "peak"]
    troughs = [p for p in spans if p["name"] == "trough"]
    if not peaks or not troughs:
        if running and phases(run):
            return Observations.none("no whole peak and trough yet (the load is still running)")
        return Observations.none(
            "meta.phases has no peak and trough phases (the shape was not peak/trough)"
        )
    events = select(run.server_events[EVENT_KEYS], run, flt, "t", class_column=None)
    requests = select(run.requests[RECORD_COLUMNS], run, flt, "t_send")
    assert not isinstance(events, str) and not isinstance(requests, str)  # no window filter
    batch_events = events[events["event"].eq(EventKind.ADMITTED) & events["priority"].eq("batch")]
    batch = requests[requests["priority"].eq("batch")]
    if batch_events.empty and batch.empty:
        return Observations.none("no batch traffic was sent, so the offline queue cannot be judged")
    # the requests as integer codes, over one dictionary with the events'
    batch_seen = events[events["priority"].eq("batch")] if running else events.iloc[:0]
    (admit_ids, seen_ids, batch_ids), ids = shared_codes(
        batch_events["request_id"], batch_seen["request_id"], batch["request_id"]
    )
    first_admitted = _earliest(admit_ids, batch_events["t"], len(ids))
    t_admit = first_admitted[batch_ids]
    t_send = batch["t_send"].to_numpy(dtype=float)

    settle = float(params["settle_s"])

    def offered(span: Mapping[str, Any]) -> tuple[int, int]:
        """(batch requests sent in the phase once it settled, those admitted before it ended)."""
        t0, t1 = float(span["t0"]), float(span["t1"])
        sent = (t_send >= t0 + settle) & (t_send < t1)
        return int(sent.sum()), int((sent & (t_admit < t1)).sum())

    trough_sent = sum(offered(p)[0] for p in troughs)
    trough_admitted = sum(offered(p)[1] for p in troughs)
    trough_share = trough_admitted / trough_sent if trough_sent else 0.0
    limit = float(params["peak_ratio_max"])
    rows: list[tuple[float, float, None, str]] = []
    unsure: list[str] = []
    close: list[str] = []  # peaks too near the line to tell alone
    read: list[tuple[int, int]] = []  # each peak read: (sent, admitted)
    # Mid-run, a record exists only for a request that has ended, and a peak's batch work
    # still waiting has none yet: read from records alone, a peak's share would count only
    # the requests already admitted and done. So a look counts each batch request the server
    # saw arrive in the peak and that has no record yet by the server's events: sent then,
    # admitted before the peak's end or not. Once the events reach past the peak's end, that
    # is what its records will say.
    # per request code: when the server first saw it, NaN once it has its record (at the
    # end of the run every request has one)
    arrived = _earliest(seen_ids, batch_seen["t"], len(ids))
    arrived[batch_ids] = np.nan
    events_until = float(events["t"].max()) if running and not events.empty else math.inf
    for span in peaks:
        t0, t1 = float(span["t0"]), float(span["t1"])
        in_flight = np.flatnonzero((arrived >= t0 + settle) & (arrived < t1))
        if len(in_flight) and events_until < t1 + EVENTS_CATCH_UP_S:
            unsure.append(
                f"peak at +{t0 - run.t_start:.0f}s: {len(in_flight)} batch requests sent in it "
                "are still in flight, and the server's events do not reach its end yet"
            )
            continue
        sent, admitted = offered(span)
        sent += len(in_flight)
        admitted += int((first_admitted[in_flight] < t1).sum())
        if sent == 0:
            unsure.append(
                f"peak at +{float(span['t0']) - run.t_start:.0f}s was offered no batch work, so "
                "nothing shows the offline queue stops there (send batch at peaks too)"
            )
            continue
        verdict, ratio = _peak_reading(admitted, sent, trough_share, limit)
        detail = (
            f"peak admitted {admitted} of {sent} batch requests sent in it vs {trough_admitted} "
            f"of {trough_sent} in the troughs (share ratio {ratio:.3g}, limit {limit:g}x)"
        )
        read.append((sent, admitted))
        if verdict == "breach":
            rows.append((ratio, float(span["t0"]), None, detail))
        elif verdict == "unsure":
            close.append(detail + ": too few requests to tell at 95%")
    # A peak near the line, alone, cannot tell; all the peaks read together can. When they
    # are clearly under it, no peak is left unsure (a longer run has more peaks, and each
    # would otherwise be another chance of one landing near the line).
    admitted_all = sum(admitted for _, admitted in read)
    sent_all = sum(sent for sent, _ in read)
    if close and _peak_reading(admitted_all, sent_all, trough_share, limit)[0] != "fine":
        unsure += close
    t_end = _stopped_waiting(batch, events, run.t_end)
    t_admitted = batch_events["t"]
    for span in troughs:
        t0, t1 = float(span["t0"]), float(span["t1"])
        count = int(in_intervals(t_admitted, [(t0, t1)]).sum())
        # time each request spent waiting inside the trough: from max(sent, t0) until it was
        # admitted or ended, capped at the trough's end
        left = np.fmin(np.fmin(t_end, np.where(np.isnan(t_admit), np.inf, t_admit)), t1)
        waited = left - np.maximum(t_send, t0)
        waiting = int((waited >= float(params["starve_after_s"])).sum())
        if count == 0 and waiting > 0:
            detail = (
                f"trough admitted no batch request while {waiting} waited "
                f">= {float(params['starve_after_s']):g}s in it: the offline queue starved"
            )
            rows.append((1.0, t0, None, detail))
    frame = _rows(*zip(*rows, strict=True)) if rows else _rows([], [], [], [])
    return Observations(frame=frame, n_samples=len(peaks) + len(troughs), unsure=unsure)


def _stopped_waiting(batch: pd.DataFrame, events: pd.DataFrame, t_end: float) -> np.ndarray:
    """When each request stopped waiting at the latest: its client's ending (send plus
    end-to-end). A refused request whose record has no ending stopped at its refusal: the
    server's last `rejected` event for it, else its send (a refusal is an answer, and
    nothing of it waits afterwards, retried or not). Any other request without an ending
    may still have been waiting when the run ended."""
    answered = batch["t_send"] + batch["e2e_s"]
    rejections = events[events["event"].eq(EventKind.REJECTED)]
    (rejected_ids, batch_ids), ids = shared_codes(rejections["request_id"], batch["request_id"])
    last = -_earliest(rejected_ids, -rejections["t"], len(ids))  # the latest, as a minimum
    refused_at = pd.Series(last[batch_ids], index=batch.index).fillna(batch["t_send"])
    refused = batch["outcome"].eq(Outcome.REJECTED)
    ended: np.ndarray = answered.fillna(refused_at.where(refused)).fillna(t_end).to_numpy(float)
    return ended


def _earliest(ids: np.ndarray, t: pd.Series, n: int) -> np.ndarray:
    """Per code below `n` (and one more, last, for a missing id: NaN), the earliest of the
    times `t` of the rows with that code; NaN for a code without a time."""
    known = ids >= 0
    earliest = np.full(n + 1, np.nan)
    np.fmin.at(earliest, ids[known], t.to_numpy(dtype=float)[known])  # fmin: NaN is no time
    return earliest


def _peak_reading(admitted: int, sent: int, trough_share: float, limit: float) -> tuple[str, float]:
    """("breach" | "fine" | "unsure", observed share ratio) for one peak against the troughs.

    The peak may admit at most `limit` x the troughs' share of what it is offered; the
    Clopper-Pearson interval of the peak's own share says whether it is above that line
    (breach), below it (fine) or undecided. The troughs' share is taken as known: they are
    offered far more batch work than a peak.
    """
    share = admitted / sent
    ratio = share / trough_share if trough_share > 0 else (np.inf if admitted else 0.0)
    line = limit * trough_share
    alpha = 1 - stats.CONFIDENCE
    lo = float(beta.ppf(alpha / 2, admitted, sent - admitted + 1)) if admitted > 0 else 0.0
    hi = float(beta.ppf(1 - alpha / 2, admitted + 1, sent - admitted)) if admitted < sent else 1.0
    if lo > line:
        return "breach", ratio
    if hi < line:
        return "fine", ratio
    return "unsure", ratio
