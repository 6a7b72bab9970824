"""Metrics over the client's per-request records (joined with server events where needed).

Latencies come from the raw per-request rows, never from Locust's rounded statistics. No
request is dropped for going badly: one the server never answered (timeout, error,
disconnect, 5xx, a stream that ended without content) is a latency of +inf, and a
cancellation whose release never came is a release latency of +inf; both count as breaches
in any percentile that reaches them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

import contract
from contract import ClientCode, EventKind, FinishReason, Outcome
from contract.enums import ANSWERED_OR_CANCELLED, DEATH_EVENTS, FAILED_OUTCOMES, NORMAL_FINISHES
from gates.keys import (
    distinct_counts,
    isin,
    numbered,
    pair_codes,
    per_distinct,
    shared_codes,
)
from gates.registry import Cause, Observations, metric
from gates.rundir import RunData
from gates.terms import GateFilter
from gates.windows import (
    broken_by_network,
    process_faults,
    select,
)

REQUEST_FILTERS = ("traffic_class", "priority", "tenant", "window")
# The columns a request's filters and its evidence row read (`select`, `_evidence`).
ROW_KEYS = ["request_id", "traffic_class", "priority", "tenant", "replica"]
# The server events' columns an event's filters and its evidence row read.
EVENT_KEYS = ["t", "event", "request_id", "priority", "tenant", "replica"]
# The requests' columns the metrics over client records read: a row selection copies only
# these, not the whole table (a copy of every column per metric is most of the memory and
# time of judging millions of requests).
RECORD_COLUMNS = [
    *ROW_KEYS,
    "t_send",
    "ttft_s",
    "e2e_s",
    "cancel_at",
    "outcome",
    "http_status",
    "error_code",
    "error_message",
    "retry_after_s",
    "chunks",
    "max_tokens",
    "completion_tokens",
    "finish_reason",
    "probe",
]
EMPTY = str(ClientCode.EMPTY_STREAM)  # the code of a record that says ok and carried nothing


def _describe(flt: GateFilter) -> str:
    parts = [", ".join(v) for v in (flt.traffic_class, flt.priority, flt.tenant) if v]
    return " ".join(parts) or "any"


def _evidence(
    rows: pd.DataFrame, value: pd.Series, time_column: str, detail: pd.Series | None = None
) -> pd.DataFrame:
    """One evidence row per request: its value, who and when, and `detail` (by default its
    class and priority)."""
    if detail is None:
        detail = per_distinct(rows, ["traffic_class", "priority"], class_priority)
    return pd.DataFrame(
        {
            "value": value.to_numpy(dtype=float),
            # the text as it is held (a frame turns Python strings back into it anyway)
            "request_id": rows["request_id"].array,
            "t": rows[time_column].to_numpy(dtype=float),
            "tenant": rows["tenant"].array,
            "replica": rows["replica"].array,
            "detail": detail.array,
        }
    )


def class_priority(rows: pd.DataFrame) -> pd.Series:
    """`short_qa/critical`: each request's traffic class and priority, as evidence and the
    report's TTFT table name them."""
    return rows["traffic_class"].astype(str) + "/" + rows["priority"].astype(str)


def answered_empty_rows(rows: pd.DataFrame) -> pd.Series:
    """contract.enums.answered_empty over a table: the `ok` records whose stream carried no
    content although they asked for output, which every gate counts as unserved."""
    return rows["outcome"].eq(Outcome.OK) & rows["chunks"].eq(0) & rows["max_tokens"].ne(0)


def latencies(rows: pd.DataFrame, column: str) -> pd.Series:
    """Each request's latency in `column`, indexed as `rows`: the measured value, +inf for one
    the server failed to answer, NaN (not judged) for one the client cancelled first or that
    was refused with a 4xx. The latency metrics and `kvgate compare` judge by this."""
    measured = rows[column].notna()
    # contract.quantiles.censored_latency, over a table: a failed ending, any 5xx (a 503
    # refusal included: the server could not serve it) or an `ok` stream that carried no
    # content is a censored latency (+inf).
    server_failed = ~measured & (
        rows["outcome"].isin(FAILED_OUTCOMES).to_numpy()
        | rows["http_status"].ge(500).to_numpy()
        | answered_empty_rows(rows).to_numpy()
    )
    return rows[column].astype(float).mask(server_failed, np.inf)


def _latency(run: RunData, flt: GateFilter, column: str, what: str) -> Observations:
    """Each request's latency (`latencies`): +inf for one the server failed to answer (a
    breach); the requests left out are counted in notes."""
    rows = select(run.requests[RECORD_COLUMNS], run, flt, "t_send")
    if isinstance(rows, str):
        return Observations.none(rows)
    value = latencies(rows, column)
    judged = value.notna()
    kept = rows[judged]
    if kept.empty:
        return Observations.none(f"no {_describe(flt)} request has a {what} in this run")
    frame = _evidence(kept, value[judged], "t_send")
    censored = kept[column].isna().to_numpy()
    failed = kept[censored]
    # a record that says ok names no code: name the ending it was
    codes = failed["error_code"].astype(str).mask(answered_empty_rows(failed), EMPTY).fillna("")
    frame.loc[censored, "detail"] = [
        f"no {what}: {outcome} status={_int_text(status)} {code}".rstrip()
        for outcome, status, code in zip(
            failed["outcome"], failed["http_status"], codes, strict=True
        )
    ]
    notes = []
    if censored.any():
        notes.append(f"{int(censored.sum())} requests got no {what} and count as breaches (+inf)")
    left_out = rows[~judged]
    if not left_out.empty:
        why = distinct_counts(left_out, ["outcome", "http_status"], lambda r: _ending(r, " "))
        counts = ", ".join(f"{n} {k}" for k, n in why.items())
        notes.append(f"left out (client cancels and 4xx refusals): {counts}")
    return Observations(frame=frame, n_samples=len(kept), notes=notes)


def _ending(rows: pd.DataFrame, between: str) -> pd.Series:
    """`rejected/503.0`: each request's outcome and HTTP status, as text."""
    return rows["outcome"].astype(str) + between + rows["http_status"].astype(str)


def _int_text(value: float) -> str:
    return "none" if pd.isna(value) else str(int(value))


@metric(
    "ttft", filters=REQUEST_FILTERS, unit="s", kind="trend", timing=True, cause=Cause.PRIORITY_RULES
)
def ttft(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """Time to first content chunk (s); +inf for a request the server never answered, or
    whose stream ended without content."""
    return _latency(run, flt, "ttft_s", "first token")


@metric("e2e", filters=REQUEST_FILTERS, unit="s", kind="trend", timing=True, cause=Cause.NONE)
def e2e(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """End-to-end latency (s), send to end of stream; +inf when the server never answered."""
    return _latency(run, flt, "e2e_s", "end-to-end latency")


@metric(
    "outcome_rate",
    filters=REQUEST_FILTERS,
    unit="fraction",
    kind="rate",
    timing=False,
    cause=Cause.NONE,
    params={"outcome": Outcome.TIMEOUT.value},
    choices={"outcome": contract.OUTCOMES},
)
def outcome_rate(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """1 for each request that ended with the given outcome, 0 otherwise (use `rate`)."""
    rows = select(run.requests[RECORD_COLUMNS], run, flt, "t_send")
    if isinstance(rows, str):
        return Observations.none(rows)
    if rows.empty:
        return Observations.none(f"no {_describe(flt)} request was sent")
    hit = rows["outcome"].eq(str(params["outcome"])).astype(float)
    return Observations(frame=_evidence(rows, hit, "t_send"), n_samples=len(rows))


# Endings the server did not choose: the replica under the request was killed (the
# failover gates judge that), or the load generator stopped it at the end of the load.
# A broken stream is blamed on a replica's death only if one died this soon after the
# request's last byte (the gateway waits for the exit before it answers).
DEATH_SLACK_S = 3.0


def cut_short(run: RunData, rows: pd.DataFrame) -> pd.Series:
    """Requests that never had their chance: the load generator stopped them, an injected
    network fault broke or stalled their connection, or the gateway reported their replica
    failed and that replica did die or freeze (an injected kill, pause, signal or command,
    an OOM, a crash) while they were in flight. A "replica failed" with no such fault behind
    it is a server that dropped the request, judged like any failure."""
    stopped = rows["error_code"].eq(ClientCode.USER_STOPPED)
    stopped |= broken_by_network(run, rows, DEATH_SLACK_S)
    failed = rows["error_code"].eq("replica_failed")
    if not failed.any():
        return stopped
    events = run.server_events
    lifecycle = events[events["event"].isin(DEATH_EVENTS)]
    faults = process_faults(run.faults).rename(columns={"target": "replica", "t_start": "t"})
    deaths = pd.concat([lifecycle[["replica", "t"]], faults[["replica", "t"]]]).dropna(subset=["t"])
    t0 = rows["t_send"].to_numpy(dtype=float)
    t_end = t0 + rows["e2e_s"].fillna(0.0).to_numpy(dtype=float)
    t1 = t_end + DEATH_SLACK_S
    # replicas by code: a request that names none (missing, or "") may have been on any
    replica, names = pd.factorize(rows["replica"], use_na_sentinel=True)
    code = {str(name): i for i, name in enumerate(names)}
    unnamed = (replica < 0) | (replica == code.get("", -2))
    died = np.zeros(len(rows), dtype=bool)
    for name, at in zip(deaths["replica"].astype(str), deaths["t"].astype(float), strict=True):
        died |= (t0 <= at) & (at <= t1) & ((replica == code.get(name, -2)) | unnamed)
    died &= ~_abandoned(events, rows, t_end)
    return stopped | (failed & pd.Series(died, index=rows.index))


def _abandoned(events: pd.DataFrame, rows: pd.DataFrame, t_end: np.ndarray) -> np.ndarray:
    """Requests their replica had released more than DEATH_SLACK_S before the client's
    answer ended: the server let go of them and left the client waiting, so a death that
    came later did not cut them short (a dropped stream that hung until a kill)."""
    released = events.loc[events["event"].eq(EventKind.RELEASED), ["request_id", "replica", "t"]]
    if released.empty:
        return np.zeros(len(rows), dtype=bool)
    # each (request, replica)'s last release, over integer codes; a release or a request
    # missing either names no pair
    (event_ids, row_ids), _ = shared_codes(released["request_id"], rows["request_id"])
    (event_on, row_on), replicas = shared_codes(released["replica"], rows["replica"])
    named = (event_ids >= 0) & (event_on >= 0)
    pairs = pair_codes(event_ids, event_on, len(replicas))[named]
    last = pd.Series(released["t"].to_numpy(dtype=float)[named]).groupby(pairs).max()
    asked = np.where((row_ids >= 0) & (row_on >= 0), pair_codes(row_ids, row_on, len(replicas)), -1)
    t_released: np.ndarray = last.reindex(asked).to_numpy(dtype=float)  # NaN: never released
    abandoned: np.ndarray = t_end - t_released > DEATH_SLACK_S
    return abandoned


@metric(
    "preempted_completion",
    filters=("priority", "tenant", "window"),
    unit="fraction",
    kind="rate",
    timing=False,
    cause=Cause.RELEASE_DEFECT,
)
def preempted_completion(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """1 per preempted request that ran again after its last preemption and then finished
    normally, else 0 (client cancels and requests cut short excluded).

    Ran again: a `resumed` event (or `admitted`, on a replica a gateway retried it on) after
    its last `preempted` one. Finished normally: its record ends `ok` with content and a
    finish_reason of `stop` or `length` (not vLLM's `abort`, not none), and, unless the
    model stopped on its own (`stop`), with every completion token it asked for (where both
    counts are known). A server that gives preempted work up may still close its stream
    cleanly: an `ok` alone does not show that the request was resumed and completed.
    """
    events = select(run.server_events[EVENT_KEYS], run, flt, "t", class_column=None)
    if isinstance(events, str):
        return Observations.none(events)
    preempted = events.loc[events["event"].eq(EventKind.PREEMPTED), "request_id"].dropna().unique()
    if len(preempted) == 0:
        return Observations.none("no request was preempted, so their fate cannot be judged")
    known = isin(run.requests["request_id"], preempted)
    rows = run.requests.loc[known & run.requests["cancel_at"].isna(), RECORD_COLUMNS]
    # A request whose replica was killed under it, or that was still running when the load
    # stopped, never had its chance to finish: that is the failover gate's business (or the
    # run's end), not evidence of starvation after preemption.
    cut = cut_short(run, rows)
    rows = rows[~cut]
    if rows.empty:
        return Observations.none(
            "the preempted requests have no client record (or the client cancelled them, "
            "their replica was killed, or the run ended under them)"
        )
    read = _completion(run.server_events, rows)
    why = per_distinct(read, list(read.columns), _why_not)
    frame = _evidence(rows, why.eq("").astype(float), "t_send")
    frame["detail"] = frame["detail"] + " " + why.where(why.ne(""), "completed").to_numpy()
    notes = []
    if cut.any():
        notes.append(
            f"{int(cut.sum())} preempted requests left out: their replica died "
            "or the run ended before they could finish"
        )
    unknown = len(preempted) - int(known.sum())
    if unknown > 0:
        notes.append(f"{unknown} preempted request ids have no client record")
    failing = distinct_counts(read, list(read.columns), _why_not_short)
    if not failing.empty:
        counts = ", ".join(f"{n} {k}" for k, n in failing.items())
        notes.append(f"not completed: {counts}")
    return Observations(frame=frame, n_samples=len(rows), notes=notes)


# The events that say where a request stands between its admission and its end: running
# (admitted, resumed) or put back to wait (preempted).
RUN_STATE_EVENTS = (EventKind.ADMITTED, EventKind.RESUMED, EventKind.PREEMPTED)


def _last_not_preempted(moves: pd.DataFrame, rows: pd.DataFrame) -> np.ndarray:
    """Per row of `rows`: whether its request's last run-state event (in time order, seq
    breaking ties) is one that runs it, not `preempted`; False without any."""
    (move_ids, row_ids), ids = shared_codes(moves["request_id"], rows["request_id"])
    order = np.lexsort((moves["seq"].to_numpy(dtype=float), moves["t"].to_numpy(dtype=float)))
    order = order[move_ids[order] >= 0]
    latest = order[::-1][numbered(move_ids[order][::-1])[1]]  # each request's last move
    running = np.zeros(len(ids) + 1, dtype=bool)  # the last entry: a request without id
    running[move_ids[latest]] = ~moves["event"].iloc[latest].eq(EventKind.PREEMPTED).to_numpy()
    found: np.ndarray = running[np.where(row_ids < 0, len(ids), row_ids)]
    return found


def _completion(events: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """What `_why_not` reads of each preempted request: its record's ending and whether it
    ran again after its last preemption (`ran_again`)."""
    moving = events["event"].isin(RUN_STATE_EVENTS).to_numpy() & isin(
        events["request_id"], rows["request_id"].unique()
    )
    moves = events.loc[moving, ["request_id", "t", "seq", "event"]]
    columns = ["outcome", "chunks", "max_tokens", "finish_reason", "completion_tokens"]
    return rows[columns].assign(ran_again=_last_not_preempted(moves, rows))


def _why_not_short(rows: pd.DataFrame) -> pd.Series:
    """`_why_not`, the token counts left out, and missing where the request completed: how
    the notes count the failures."""
    why = _why_not(rows)
    short = why.str.replace(r" after \d+ of \d+ tokens", " short", regex=True)
    return short.where(why.ne(""))


def _why_not(rows: pd.DataFrame) -> pd.Series:
    """Per preempted request: why it did not complete, the first reason that holds ("" when
    it completed)."""
    ran_again = rows["ran_again"]
    finish = rows["finish_reason"]
    finished = "finished " + finish.astype(str).fillna("without a finish_reason")
    tokens, asked = rows["completion_tokens"], rows["max_tokens"]
    short = tokens.lt(asked) & finish.ne(FinishReason.STOP)
    counts = " after " + tokens.map("{:.0f}".format) + " of " + asked.map("{:.0f}".format)
    reasons = [
        (rows["outcome"].ne(Outcome.OK), "ended " + rows["outcome"].astype(str)),
        (answered_empty_rows(rows), "ended ok without content"),
        (~ran_again, "never resumed after its last preemption"),
        (~finish.isin(NORMAL_FINISHES), finished),
        (short, finished + counts + " tokens"),
    ]
    why = pd.Series("", index=rows.index, dtype=object)
    for hit, reason in reversed(reasons):  # the first reason that holds is the one named
        why = why.mask(hit, reason)
    return why


@metric(
    "critical_preemptions",
    filters=("tenant", "window"),
    unit="count",
    kind="count",
    timing=False,
    cause=Cause.NONE,
)
def critical_preemptions(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """Preemptions that took critical work while its replica was not at risk of running out of
    memory (reason other than contract.PREEMPT_AT_RISK): one row each; every preemption in
    the window is examined. Victims come from the lower tiers first, so critical work is
    touched only when the process itself is at risk."""
    events = select(run.server_events[[*EVENT_KEYS, "reason"]], run, flt, "t", class_column=None)
    if isinstance(events, str):
        return Observations.none(events)
    preempted = events[events["event"].eq(EventKind.PREEMPTED)]
    if preempted.empty:
        return Observations.none(
            "no request was preempted (or the server shows no per-request events), so the "
            "choice of victims cannot be judged"
        )
    bad = preempted[
        preempted["priority"].eq("critical") & preempted["reason"].ne(contract.PREEMPT_AT_RISK)
    ]
    frame = pd.DataFrame(
        {
            "value": 1.0,
            "request_id": bad["request_id"].to_numpy(),
            "t": bad["t"].to_numpy(dtype=float),
            "tenant": bad["tenant"].to_numpy(),
            "replica": bad["replica"].to_numpy(),
            "detail": "critical request preempted (" + bad["reason"].astype(str).to_numpy() + ")",
        }
    )
    by_priority = preempted["priority"].astype(str).value_counts()
    notes = [
        "preemptions by priority: " + ", ".join(f"{p} {n}" for p, n in by_priority.items()),
    ]
    if not bad.empty:
        notes.append(f"{bad['request_id'].nunique()} distinct critical requests were victims")
    return Observations(frame=frame, n_samples=len(preempted), notes=notes)


@metric(
    "explicit_refusal",
    filters=REQUEST_FILTERS,
    unit="fraction",
    kind="rate",
    timing=False,
    cause=Cause.PRIORITY_RULES,
)
def explicit_refusal(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """Of requests the server did not serve: 1 when refused with 429/503 and Retry-After.

    Counted: every request that did not end ok and was not cancelled by its client —
    rejections, errors (a 500 is not a refusal, nor is a stream without content), timeouts,
    disconnects, protocol errors.
    Left out: 4xx other than 429 (the request itself was wrong: too long, a priority its key
    does not allow), which are the client's to fix, not the server's way of shedding load;
    and requests cut short by a replica's death or the end of the load (`cut_short`).
    """
    rows = select(run.requests[RECORD_COLUMNS], run, flt, "t_send")
    if isinstance(rows, str):
        return Observations.none(rows)
    status = rows["http_status"]
    client_fault = status.ge(400) & status.lt(500) & status.ne(429)
    cut = cut_short(run, rows)
    not_served = ~rows["outcome"].isin(ANSWERED_OR_CANCELLED) | answered_empty_rows(rows)
    unserved = rows[not_served & ~client_fault & ~cut]
    if unserved.empty:
        return Observations.none(
            f"no {_describe(flt)} request was refused or failed; no pressure to judge"
        )
    retry_status = unserved["http_status"].isin(contract.RETRY_STATUSES)
    explicit = retry_status & unserved["retry_after_s"].notna()
    ending = ["outcome", "http_status"]
    detail = per_distinct(unserved, ending, lambda r: _ending(r, " status="))
    frame = _evidence(unserved, explicit.astype(float), "t_send", detail)
    counts = distinct_counts(unserved, ending, lambda r: _ending(r, "/"))
    notes = ["counted: " + ", ".join(f"{n} {k}" for k, n in counts.items())]
    if client_fault.any():
        notes.append(f"left out: {int(client_fault.sum())} client errors (4xx other than 429)")
    if cut.any():
        notes.append(
            f"left out: {int(cut.sum())} requests cut short by a replica's death "
            "or the end of the load"
        )
    return Observations(frame=frame, n_samples=len(unserved), notes=notes)
