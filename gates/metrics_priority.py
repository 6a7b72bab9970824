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
from gates.metrics_requests import REQUEST_FILTERS, ttft
from gates.registry import Cause, Observations, metric
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
    ev = events[events["event"].isin(WAIT_STARTS + WAIT_ENDS) & events["request_id"].notna()]
    if ev.empty:
        return pd.DataFrame(columns=["request_id", "priority", "t0", "t1"])
    ev = ev.sort_values(["request_id", "t", "seq"], kind="stable")
    starts = ev["event"].isin(WAIT_STARTS).to_numpy()
    same = ev["request_id"].eq(ev["request_id"].shift(-1)).to_numpy()
    t_next = ev["t"].shift(-1).to_numpy(dtype=float)
    t1 = np.where(same, t_next, t_end)
    spans = pd.DataFrame(
        {
            "request_id": ev["request_id"].to_numpy(),
            "priority": ev["priority"].to_numpy(),
            "t0": ev["t"].to_numpy(dtype=float),
            "t1": t1,
        }
    )
    return spans[starts & (spans["t1"] > spans["t0"])]


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
    latencies = ttft(run, flt, {})
    if latencies.n_samples == 0:
        return latencies
    t_end = float(run.meta.get("t_end") or events["t"].max())
    spans = waiting_spans(events, t_end)
    sent = run.requests.drop_duplicates("request_id").set_index("request_id")
    t_send = latencies.frame["t"].to_numpy(dtype=float)
    priority = latencies.frame["request_id"].map(sent["priority"]).astype(str).to_numpy()
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
    waited = run.requests[run.requests["request_id"].isin(spans["request_id"])]
    waited = waited[waited["ttft_s"].notna()]
    if waited.empty:
        return []
    median = float(np.median(waited["ttft_s"].to_numpy(dtype=float)))
    return [f"the requests that waited had a median TTFT of {median:.3g} s"]
