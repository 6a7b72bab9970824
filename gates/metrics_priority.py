"""Priority under pressure: does the server serve higher priorities first when work waits?

A server's queue only matters when something waits in it. This metric takes the requests of
its filter (the critical ones, in the built-in gate) that were sent while work of a lower
priority was waiting in the server's queue, or preempted and not yet resumed — the moments
when a first-come-first-served scheduler makes them wait behind that work and a priority
scheduler does not — and judges their TTFT. The server's own per-request events say who
waited when (`queued`/`preempted` until `admitted`/`resumed` or an end), so it needs
`server_events`: the reference server's, or vLLM's through kvgate's scheduler recorder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

import contract
from contract import EventKind
from gates.keys import first_index, isin, text_codes
from gates.metrics_requests import REQUEST_FILTERS
from gates.registry import REGISTRY, Cause, Observations, metric
from gates.rundir import RunData
from gates.terms import GateFilter

WAIT_STARTS = (EventKind.QUEUED, EventKind.PREEMPTED)
WAIT_ENDS = (
    EventKind.ADMITTED,
    EventKind.RESUMED,
    EventKind.REJECTED,
    EventKind.CANCELLED,
    EventKind.RELEASED,
    EventKind.FINISHED,
)


def waiting_spans(events: pd.DataFrame, t_end: float) -> pd.DataFrame:
    """One row per stretch a request spent waiting: request_id, priority, t0, t1 (t_end when
    the run ended with it still waiting)."""
    wanted = events["event"].isin(WAIT_STARTS + WAIT_ENDS) & events["request_id"].notna()
    ids = text_codes(events["request_id"])
    # only the requests that ever waited have a span: the others' events are left unsorted
    waited = np.zeros(int(ids.max(initial=-1)) + 2, dtype=bool)
    waited[ids[events["event"].isin(WAIT_STARTS).to_numpy()]] = True
    ev = events.loc[
        wanted.to_numpy() & waited[ids], ["request_id", "priority", "event", "t", "seq"]
    ]
    if ev.empty:
        return pd.DataFrame(columns=["request_id", "priority", "t0", "t1"])
    # each request's events in time order (seq breaks ties), the requests side by side
    ids, t = text_codes(ev["request_id"]), ev["t"].to_numpy(dtype=float)
    order = np.lexsort((ev["seq"].to_numpy(dtype=float), t, ids))
    ids, t = ids[order], t[order]
    starts = ev["event"].isin(WAIT_STARTS).to_numpy()[order]
    same = np.append(ids[1:] == ids[:-1], False)
    t1 = np.where(same, np.append(t[1:], np.nan), t_end)
    kept = np.flatnonzero(starts & (t1 > t))
    rows = order[kept]
    return pd.DataFrame(
        {
            "request_id": ev["request_id"].array.take(rows),
            "priority": ev["priority"].array.take(rows),
            "t0": t[kept],
            "t1": t1[kept],
        },
        index=kept,
    )


def lower_waiting(spans: pd.DataFrame, t: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """For each (t, priority): how many requests of a lower priority were waiting at t."""
    rank = {p: i for i, p in enumerate(contract.PRIORITIES)}  # 0 is the highest
    out = np.zeros(len(t), dtype=int)
    span_rank = spans["priority"].map(rank).to_numpy(dtype=float)  # NaN: unknown priority
    for p, r in rank.items():
        mine = priority == p
        lower = spans[span_rank > r]
        if not mine.any() or lower.empty:
            continue
        t0 = np.sort(lower["t0"].to_numpy(dtype=float))
        t1 = np.sort(lower["t1"].to_numpy(dtype=float))
        at = t[mine]
        out[mine] = np.searchsorted(t0, at, side="right") - np.searchsorted(t1, at, side="right")
    return out


@metric(
    "ttft_under_pressure",
    filters=REQUEST_FILTERS,
    unit="s",
    kind="trend",
    timing=True,
    cause=Cause.PRIORITY_RULES,
    params={"min_waiting": 1},
)
def ttft_under_pressure(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """TTFT (s) of requests sent while lower-priority work waited in the server; +inf when
    the server never answered."""
    events = run.server_events
    if not events["event"].isin(WAIT_STARTS).any():
        return Observations.none(
            "no request ever waited in the server's queue (or it shows no per-request events), "
            "so whether it serves higher priorities first cannot be judged: the plan needs "
            "more work than the server holds at once"
        )
    latencies = REGISTRY["ttft"].compute(run, flt, {})  # the TTFT gate's, when it has one
    if latencies.n_samples == 0:
        return latencies
    t_end = float(run.meta.get("t_end") or events["t"].max())
    spans = waiting_spans(events, t_end)
    sent = run.requests[["request_id", "priority"]]
    t_send = latencies.frame["t"].to_numpy(dtype=float)
    first = first_index(latencies.frame["request_id"], sent["request_id"])
    priority = sent["priority"].array.take(np.maximum(first, 0)).to_numpy(dtype=object)
    priority[first < 0] = None
    waiting = lower_waiting(spans, t_send, priority)
    pressed = waiting >= int(params["min_waiting"])
    if not pressed.any():
        return Observations.none(
            f"none of the {latencies.n_samples} requests of this gate was sent while "
            "lower-priority work waited in the server, so priority was never put to the test"
        )
    frame = latencies.frame[pressed].copy()
    frame["detail"] = [
        f"{detail}; {n} lower-priority waiting"
        for detail, n in zip(frame["detail"], waiting[pressed], strict=True)
    ]
    notes = [
        f"{int(pressed.sum())} of {latencies.n_samples} requests were sent while lower-priority "
        f"work waited (up to {int(waiting.max())} at once)",
        *_lower_ttft_note(run, spans, latencies.frame.loc[pressed, "t"]),
        *latencies.notes,
    ]
    return Observations(frame=frame, n_samples=int(pressed.sum()), notes=notes)


def _lower_ttft_note(run: RunData, spans: pd.DataFrame, times: pd.Series) -> list[str]:
    """What the waiting work itself saw, for contrast: a priority scheduler keeps the gate's
    requests faster than the work they overtook; FCFS makes them alike."""
    if spans.empty or times.empty:
        return []
    ttft_s = run.requests["ttft_s"].to_numpy(dtype=float)
    waited = ttft_s[isin(run.requests["request_id"], spans["request_id"]) & ~np.isnan(ttft_s)]
    if waited.size == 0:
        return []
    median = float(np.median(waited))
    return [f"the requests that waited had a median TTFT of {median:.3g} s"]
