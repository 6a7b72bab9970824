"""Client-side metrics: what the load generator saw, valid for every target.

They need nothing from the server but its answers, so a server that exposes no telemetry
at all still gets a verdict from them. A request counts as *failed* when the server did not
serve it and did not refuse it explicitly:

- it ended in an error, a timeout, a disconnect or a protocol error; an error includes a
  stream that ended cleanly without content although it asked for output (the client's
  `empty_stream`; a record that says `ok` with no content chunk counts the same);
- it got a 5xx, except a 503 with Retry-After (load shed on purpose: the refusal gate judges
  those);
- it got a 4xx other than 429: the server could not serve what the plan sends (a wrong model
  name, an unknown field, a prompt too long), which must never pass silently.

Left out: requests the client cancelled, the security probes (whose refusals are their
point), and requests cut short by an injected fault or the end of the load (`cut_short`:
the failover gate judges those).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

import contract
from contract import Outcome
from contract.enums import FAILED_OUTCOMES, answered_empty
from gates import categories
from gates.keys import per_distinct
from gates.metrics_requests import (
    EMPTY,
    RECORD_COLUMNS,
    REQUEST_FILTERS,
    _describe,
    _evidence,
    answered_empty_rows,
    class_priority,
    cut_short,
)
from gates.registry import Cause, Observations, metric
from gates.rundir import RunData
from gates.terms import GateFilter
from gates.windows import select_mask

TOP_ERRORS = 5


def _judged(run: RunData, flt: GateFilter) -> tuple[pd.DataFrame, list[str]] | str:
    """The requests these metrics judge, and notes on what was left out (or why none)."""
    chosen = _chosen(run, flt)
    if isinstance(chosen, str):
        return chosen
    kept, notes = chosen
    if not kept.any():
        return f"no {_describe(flt)} request that the client did not cancel was sent"
    return run.requests.loc[kept, RECORD_COLUMNS], notes


def _chosen(run: RunData, flt: GateFilter) -> tuple[np.ndarray, list[str]] | str:
    """Which requests `_judged` keeps, as a mask over the requests table, and its notes;
    found once per filter for all the metrics that judge them (a mask is small to keep, the
    rows are not)."""
    key = ("client-judged", flt.model_dump_json())
    if key not in run.cache:
        run.cache[key] = _choose(run, flt)
    chosen: tuple[np.ndarray, list[str]] | str = run.cache[key]
    return chosen


def _choose(run: RunData, flt: GateFilter) -> tuple[np.ndarray, list[str]] | str:
    requests = run.requests
    chosen = select_mask(requests, run, flt, "t_send")
    if isinstance(chosen, str):
        return chosen
    rows = requests.loc[chosen, RECORD_COLUMNS] if not chosen.all() else requests[RECORD_COLUMNS]
    probes = rows["probe"].notna() if "probe" in rows else pd.Series(False, index=rows.index)
    cancelled = rows["outcome"].eq(Outcome.CANCELLED)  # only ever the client's doing
    cut = cut_short(run, rows)
    notes = []
    if cut.any():
        notes.append(
            f"{int(cut.sum())} requests cut short by an injected fault or the end of the load "
            "left out (the failover gate judges them)"
        )
    kept = chosen.copy()
    kept[chosen] = (~probes & ~cancelled & ~cut).to_numpy(dtype=bool)
    return kept, notes


def request_failed(
    outcome: str,
    http_status: float | None,
    retry_after_s: float | None,
    chunks: float | None = None,
    max_tokens: float | None = None,
) -> bool:
    """One request's `failed`, for code that sees requests one at a time (the run's early
    stop); `failed` below is the same rule over a table. Without `chunks`, an `ok` is taken
    as served."""
    if outcome in FAILED_OUTCOMES or answered_empty(outcome, chunks, max_tokens):
        return True
    if http_status is None or http_status != http_status:  # None or NaN: no status
        return False
    shed = http_status in contract.RETRY_STATUSES and retry_after_s is not None
    return (http_status >= 500 and not shed) or (400 <= http_status < 500 and http_status != 429)


def failed(rows: pd.DataFrame) -> pd.Series:
    """True for each request the server neither served nor refused explicitly."""
    status = rows["http_status"]
    shed = status.isin(contract.RETRY_STATUSES) & rows["retry_after_s"].notna()
    server_error = status.ge(500) & ~shed
    client_error = status.ge(400) & status.lt(500) & status.ne(429)
    ended_badly = rows["outcome"].isin(FAILED_OUTCOMES) | answered_empty_rows(rows)
    return (ended_badly | server_error | client_error).fillna(False).astype(bool)


# What `breakdown` reads: a class's rows and what `failure_label` reads of them.
LABELLED = [
    "traffic_class",
    "http_status",
    "outcome",
    "error_code",
    "error_message",
    "chunks",
    "max_tokens",
]


def failure_label(rows: pd.DataFrame) -> pd.Series:
    """`HTTP 503 rejected deadline_expired`: one short label per request, its status, outcome
    and error code (the message only when there is no code, cut short), so requests that
    failed alike count together. The gates' notes and the reports' outcome table share it."""
    if rows.empty:
        return pd.Series([], dtype=object)
    endings = rows[ENDING].assign(empty=answered_empty_rows(rows))
    return per_distinct(endings, [*ENDING, "empty"], _labels)


# What a request's failure_label reads.
ENDING = ["http_status", "outcome", "error_code", "error_message"]


def labelled_evidence(rows: pd.DataFrame, value: pd.Series) -> pd.DataFrame:
    """The evidence rows of `rows` (metrics_requests._evidence) with each request's class
    and priority, then its failure_label, as detail: the text made once per distinct
    combination of the columns it reads, not once per request and again per part."""
    columns = ["traffic_class", "priority", *ENDING]
    read = rows[columns].assign(empty=answered_empty_rows(rows))
    detail = per_distinct(
        read, [*columns, "empty"], lambda r: class_priority(r) + " " + _labels(r).array
    )
    return _evidence(rows, value, "t_send", detail)


def _labels(rows: pd.DataFrame) -> pd.Series:
    """`failure_label` of rows that say whether each was an empty answer (`empty`)."""
    empty = rows["empty"]
    status = rows["http_status"].map(lambda s: "" if pd.isna(s) else f"HTTP {int(s)} ").astype(str)
    code = rows["error_code"].astype(str).mask(empty, EMPTY).fillna("")
    message = rows["error_message"].astype(str).fillna("").str.slice(0, 80)
    return (
        status + rows["outcome"].astype(str) + " " + code.where(code.ne(""), message)
    ).str.strip()


def breakdown(rows: pd.DataFrame, bad: pd.Series) -> list[str]:
    """Per traffic class: how many failed of how many, and the commonest reasons."""
    lines = []
    sent = categories.counts(rows["traffic_class"])
    failing = rows.loc[bad.to_numpy(dtype=bool), LABELLED]  # only the failed rows are read
    for klass, group in failing.groupby("traffic_class", sort=True):
        reasons = failure_label(group).value_counts().head(TOP_ERRORS)
        top = "; ".join(f"{n} {label}" for label, n in reasons.items())
        lines.append(f"{klass}: {len(group)} of {int(sent[klass])} failed ({top})")
    return lines


@metric(
    "availability",
    filters=REQUEST_FILTERS,
    unit="fraction",
    kind="rate",
    timing=False,
    cause=Cause.NONE,
)
def availability(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """1 per request the server served or refused explicitly (429, or 503 with Retry-After);
    0 per failed request (see the module docstring). The notes break failures down by class."""
    judged = _judged(run, flt)
    if isinstance(judged, str):
        return Observations.none(judged)
    rows, notes = judged
    bad = failed(rows)
    frame = labelled_evidence(rows, (~bad).astype(float))
    return Observations(frame=frame, n_samples=len(rows), notes=breakdown(rows, bad) + notes)


@metric(
    "timeouts_disconnects",
    filters=REQUEST_FILTERS,
    unit="fraction",
    kind="rate",
    timing=False,
    cause=Cause.NONE,
)
def timeouts_disconnects(run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
    """1 per request that timed out or whose connection dropped mid-answer, else 0: the
    failures a client cannot tell from a hung server (use `rate`)."""
    judged = _judged(run, flt)
    if isinstance(judged, str):
        return Observations.none(judged)
    rows, notes = judged
    hit = rows["outcome"].isin((Outcome.TIMEOUT, Outcome.DISCONNECTED))
    frame = labelled_evidence(rows, hit.astype(float))
    counts = categories.counts(rows.loc[hit, "outcome"])
    if not counts.empty:
        notes = [", ".join(f"{n} {o}" for o, n in counts.items()), *breakdown(rows, hit), *notes]
    return Observations(frame=frame, n_samples=len(rows), notes=notes)
