"""Evidence checks on single records: each value in its column's domain (enum domains) and
its range (value ranges), and each record once (unique records).

The first two refuse: a priority nobody defined or a negative TTFT is a writer's bug, and a
verdict built on it would judge what the writer got wrong, not the server. Null is left to
the null check: here a missing value is never out of its domain or range (except where a
record's other columns say the value must exist).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from contract import OUTCOMES, PRIORITIES, SERVER_EVENT_KINDS, TRAFFIC_CLASSES, Outcome
from gates import schema
from gates.evidence.base import ROWS_SHOWN, Effect, Finding, evidence_check, flagged
from gates.keys import numbered, pair_codes, text_codes
from gates.rundir import RunData

REQUESTS, SERVER_EVENTS = schema.REQUESTS, schema.SERVER_EVENTS
VALUES_SHOWN = 5  # distinct wrong values (or row/value pairs) a message spells out

# (table, column, the values it may hold, what those are)
DOMAINS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    (REQUESTS, "priority", PRIORITIES, "a contract.Priority"),
    (REQUESTS, "traffic_class", TRAFFIC_CLASSES, "a traffic class of contract.TRAFFIC_CLASSES"),
    (REQUESTS, "outcome", OUTCOMES, "a contract.Outcome"),
    (SERVER_EVENTS, "event", SERVER_EVENT_KINDS, "a contract.EventKind"),
)


@evidence_check("enum_domains", order=10)
def enum_domains(run: RunData) -> list[Finding]:
    """Priorities, traffic classes, outcomes and event kinds are values the contract defines."""
    found = [
        _outside(run.table(table), table, column, allowed, what)
        for table, column, allowed, what in DOMAINS
    ]
    found.append(_event_priorities(run))
    return [f for f in found if f is not None]


def _event_priorities(run: RunData) -> Finding | None:
    """server_events.priority: a Priority, or on a server whose profile sends priorities as
    integers (vLLM's `priority` field) an integer of its own. Its recorder writes the name
    the profile maps to the integer a request ran at, and the integer itself when none does
    (a request some other client sent at a priority kvgate never uses)."""
    events = run.server_events
    what = "a contract.Priority"
    integers = None
    if run.profile.priority_values is not None:
        what += f" or an integer priority of {run.profile.kind}'s own"
        integers = events["priority"].str.fullmatch(r"-?\d+").fillna(False).astype(bool)
    return _outside(events, SERVER_EVENTS, "priority", PRIORITIES, what, also=integers)


def _outside(
    frame: pd.DataFrame,
    table: str,
    column: str,
    allowed: Sequence[str],
    what: str,
    also: pd.Series | None = None,
) -> Finding | None:
    """A refusal naming the values of `column` that are not in `allowed` (nor `also`)."""
    values = frame[column]
    bad = values.notna() & ~values.isin(allowed)
    if also is not None:
        bad &= ~also
    if not bad.any():
        return None
    wrong = values[bad]
    shown = []
    for value in wrong.drop_duplicates().head(VALUES_SHOWN):
        rows = wrong.index[wrong.eq(value)]
        hint = _hint(str(value), allowed)
        shown.append(f"{value!r} ({_rows_text(rows)}{f'; did you mean {hint!r}?' if hint else ''})")
    more = wrong.nunique() - len(shown)
    listed = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    return flagged(
        "enum_domains",
        Effect.REFUSE,
        f"{table}.{column} holds {len(wrong)} value(s) that are not {what}: {listed}; "
        f"allowed: {', '.join(allowed)}",
        table,
        wrong.index,
        column,
    )


def _hint(value: str, allowed: Iterable[str]) -> str | None:
    """The allowed value `value` differs from only by case or `-` for `_`, if one does."""
    key = value.strip().casefold().replace("-", "_")
    return next((a for a in allowed if a.casefold().replace("-", "_") == key), None)


def _rows_text(rows: Iterable[int]) -> str:
    listed = [int(r) for r in rows]
    head = ", ".join(str(r) for r in listed[:3])
    more = f", ... ({len(listed)} rows)" if len(listed) > 3 else ""
    return f"row{'s' if len(listed) > 1 else ''} {head}{more}"


# -- value ranges ------------------------------------------------------------------------

DURATIONS = ("ttft_s", "e2e_s", "itl_mean_s", "itl_p50_s", "itl_p99_s", "itl_max_s")
COUNTS = (
    "chunks",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "target_prompt_tokens",
    "max_tokens",
)
# Both are differences of the same client clock from the same send, so the first token can
# never come after the end; a millisecond allows a writer that rounds them to milliseconds.
TTFT_AFTER_END_S = 1e-3
HTTP_STATUSES = (100, 599)


@evidence_check("value_ranges", order=20)
def value_ranges(run: RunData) -> list[Finding]:
    """Request records hold possible numbers: no negative time or count, first token by the end."""
    rows = run.requests
    checks: list[tuple[str, pd.Series, str, str | None]] = [
        (c, rows[c] < 0, "is negative: no time from a request's send can be", None)
        for c in DURATIONS
    ]
    checks.append(("retry_after_s", rows["retry_after_s"] < 0, "is negative: no wait can be", None))
    checks += [(c, rows[c] < 0, "is negative: no count can be", None) for c in COUNTS]
    checks.append(
        (
            "ttft_s",
            rows["ttft_s"] > rows["e2e_s"] + TTFT_AFTER_END_S,
            "is later than e2e_s: the first token came after the request had ended",
            "e2e_s",
        )
    )
    streamed = rows["outcome"].eq(Outcome.OK) & (rows["chunks"] > 0)
    checks.append(
        (
            "ttft_s",
            rows["ttft_s"].isna() & streamed,
            "is missing on an ok request that streamed content: its first token came, so its "
            "writer knew when",
            "chunks",
        )
    )
    finite = np.isfinite(rows["t_send"].to_numpy(dtype=float))
    checks.append(("t_send", pd.Series(~finite, index=rows.index), "is not a finite time", None))
    low, high = HTTP_STATUSES
    status = rows["http_status"]
    checks.append(
        (
            "http_status",
            (status < low) | (status > high),
            f"is no HTTP status ({low}..{high})",
            None,
        )
    )
    return [
        _impossible(rows, column, mask, why, beside)
        for column, mask, why, beside in checks
        if bool(mask.any())
    ]


# Columns whose value the client copies from the server's answer: a refusal says so, for
# the writer is then right and the server is what to look at.
FROM_SERVER = {
    "retry_after_s": "the Retry-After header",
    "prompt_tokens": "the usage",
    "completion_tokens": "the usage",
    "cached_tokens": "the usage",
    "http_status": "the status line",
}


def _impossible(
    rows: pd.DataFrame, column: str, mask: pd.Series, why: str, beside: str | None
) -> Finding:
    """A refusal naming the first rows where `column` breaks its range, with their values
    (and the value of `beside`, the column that shows why)."""
    bad = rows.index[mask.to_numpy(dtype=bool)]
    pairs = []
    for i in bad[:VALUES_SHOWN]:
        shown = f"row {i}: {_number(rows.at[i, column])}"
        if beside is not None:
            shown += f" ({beside} {_number(rows.at[i, beside])})"
        pairs.append(shown)
    more = f" and {len(bad) - len(pairs)} more" if len(bad) > len(pairs) else ""
    source = FROM_SERVER.get(column)
    came = f" (as the client recorded it from {source} the server sent)" if source else ""
    return flagged(
        "value_ranges",
        Effect.REFUSE,
        f"{REQUESTS}.{column} {why}: {', '.join(pairs)}{more}{came}",
        REQUESTS,
        bad,
        column,
    )


def _number(value: object) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "null"
    return f"{value:g}" if isinstance(value, float) else str(value)


# -- uniqueness ----------------------------------------------------------------------------


@evidence_check("unique_records", order=100)
def unique_records(run: RunData) -> list[Finding]:
    """Each request and each server event is recorded once; copies are dropped before judging."""
    requests, found = _dedupe(
        run.requests, REQUESTS, ["request_id"], run.requests["request_id"].notna(), "request"
    )
    # The harness's own rows (replica lifecycle) count seq down from -1 in each sampler
    # process, a count no promise keeps unique across the sampler's restarts; a server's own
    # seq counts up per replica and goes on across its restarts (the reference server and
    # the vLLM recorder resume it from their files), so (replica, seq) names one row for good.
    events = run.server_events
    server_rows = events["replica"].notna() & (events["seq"] >= 0)
    events, more = _dedupe(events, SERVER_EVENTS, ["replica", "seq"], server_rows, "event")
    run.requests, run.server_events = requests, events
    return found + more


def _dedupe(
    frame: pd.DataFrame, table: str, key: list[str], keyed: pd.Series, noun: str
) -> tuple[pd.DataFrame, list[Finding]]:
    """`frame` with each `key` once among the `keyed` rows (the first kept), and what was
    dropped: exact copies (equal in every column of the contract), then rows that share a
    key but not their contents. Rows keep their index: findings name rows as read."""
    findings: list[Finding] = []
    if not _any_repeated(frame, key, keyed.to_numpy(dtype=bool)):
        return frame, findings  # the common case: the keys compared as integers, nothing else
    repeated = frame.duplicated(subset=key, keep=False) & keyed
    columns = list(schema.TABLE_COLUMNS[table])
    suspects = frame[repeated]
    copies = pd.Series(False, index=frame.index)
    copies[suspects.index[suspects.duplicated(subset=columns, keep="first")]] = True
    if copies.any():
        dropped = frame.index[copies]
        ids = frame.loc[copies, key].drop_duplicates().shape[0]
        findings.append(
            flagged(
                "unique_records",
                Effect.INVALID,
                f"{len(dropped)} {table} row(s) written twice (exact copies of an earlier row, "
                f"{ids} {noun}(s)): each was judged once, but a writer that duplicates records "
                "may have lost others; find why it wrote them twice and re-run",
                table,
                dropped,
            )
        )
        frame, keyed = frame[~copies], keyed[~copies]
    clash = frame.duplicated(subset=key, keep=False) & keyed
    if clash.any():
        later = frame.duplicated(subset=key, keep="first") & keyed
        findings.append(_clashes(frame[clash], table, key, noun, columns))
        frame = frame[~later]
    return frame, findings


def _any_repeated(frame: pd.DataFrame, key: list[str], keyed: np.ndarray) -> bool:
    """Whether any key occurs twice among the `keyed` rows (whose key columns hold values),
    counted over integer codes: a request id's code, a replica's code and a whole-number
    seq."""
    rows = frame[key][keyed]
    if rows.empty:
        return False
    if _rising_within(rows, key):
        return False
    combined: np.ndarray | None = None
    for column in key:
        values = rows[column]
        if pd.api.types.is_numeric_dtype(values):  # whole numbers (seq), numbered densely
            code = numbered(values.to_numpy(dtype=np.int64))[0]
        else:
            code = text_codes(values)
        if combined is not None:  # numbered again, so that the pairs' codes stay narrow
            code = numbered(pair_codes(combined, code, int(code.max()) + 1))[0]
        combined = code
    assert combined is not None
    return int(numbered(combined)[0].max()) + 1 < len(combined)


def _rising_within(rows: pd.DataFrame, key: list[str]) -> bool:
    """Whether no key repeats, shown without counting pairs of keys: one text column holds
    each code once; or a number column rises strictly, row after row, within each value of
    one text column before it (a replica's seq as it writes its events). False where it
    cannot tell."""
    *groups, last = key
    values = rows[last]
    if not groups:
        if pd.api.types.is_numeric_dtype(values):
            return False
        return bool(np.bincount(text_codes(values)).max(initial=0) <= 1)
    if len(groups) > 1 or not pd.api.types.is_numeric_dtype(values):
        return False
    within = numbered(text_codes(rows[groups[0]]))[0]
    if int(within.max()) + 1 > MANY_GROUPS:
        return False  # too many values to go through one by one
    numbers = values.to_numpy(dtype=float)
    for group in range(int(within.max()) + 1):
        mine = numbers[within == group]
        if not np.all(mine[1:] > mine[:-1]):
            return False
    return True


# Key prefixes with more values than this (replicas, in practice a handful) are counted.
MANY_GROUPS = 64


def _clashes(
    rows: pd.DataFrame, table: str, key: list[str], noun: str, columns: list[str]
) -> Finding:
    """An INVALID finding over rows that share a key with different contents (first kept)."""
    # the few clashing rows' keys as text: grouping by a categorical goes through all its
    # categories, and a request id has one per request of the run
    text = {c: str for c in key if isinstance(rows[c].dtype, pd.CategoricalDtype)}
    groups = list(rows.astype(text).groupby(key, sort=False))
    shown = []
    for name, group in groups[:VALUES_SHOWN]:
        label = "/".join(_number(v) for v in (name if isinstance(name, tuple) else (name,)))
        differ = [c for c in columns if group[c].nunique(dropna=False) > 1]
        shown.append(
            f"{label} in rows {', '.join(str(i) for i in group.index[:ROWS_SHOWN])} "
            f"(differing in {', '.join(differ[:6])}{', ...' if len(differ) > 6 else ''})"
        )
    more = f" and {len(groups) - len(shown)} more" if len(groups) > len(shown) else ""
    return flagged(
        "unique_records",
        Effect.INVALID,
        f"{len(groups)} {noun}(s) recorded more than once with different contents: "
        f"{'; '.join(shown)}{more}. The first row of each was judged and "
        f"{len(rows) - len(groups)} later row(s) dropped, but nobody can tell which is true; "
        "find what wrote both and re-run",
        table,
        rows.index,
    )
