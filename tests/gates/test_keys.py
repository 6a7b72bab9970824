"""Integer keys (gates/keys.py) and the metrics rewritten over them give what the pandas
formulations they replaced gave, kept here as the reference, over tables hypothesis draws
with the awkward cases: missing ids and replicas, ties in time, repeated ids, releases by a
replica that never held the request, deaths after a cancel. Each metric is run over its
tables as the reader holds them (request ids coded over one dictionary for both tables)
and as text, the way a table built by hand comes; the references read text."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contract import EventKind
from contract.enums import DEATH_EVENTS
from gates import schema
from gates.evidence.checks_clock import ENTRY_EVENTS, offset_intervals
from gates.evidence.checks_events import release_by_holder
from gates.keys import (
    distinct_categories,
    distinct_counts,
    first_index,
    in_time,
    isin,
    members,
    numbered,
    one_dictionary,
    pair_codes,
    per_distinct,
    shared_codes,
    text_codes,
)
from gates.metrics_client import failure_label
from gates.metrics_priority import waiting_spans
from gates.metrics_release import cancel_release_latency
from gates.metrics_requests import EMPTY, _evidence, answered_empty_rows
from gates.metrics_server import _on_two_replicas
from gates.registry import Observations
from gates.rundir import RunData, load_run, rows_frame, share_dictionaries
from gates.terms import GateFilter
from gates.windows import replica_deaths
from reports.analysis import reservation_error
from tests.gates.builder import T0, RunBuilder

IDS = st.sampled_from(["a", "b", "c", "ab", "a-b", None])
REPLICAS = st.sampled_from(["r0", "r1", None])
KINDS = st.sampled_from([str(k) for k in EventKind])
TIMES = st.sampled_from([T0 + x / 2 for x in range(12)] + [None])
EXAMPLES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with its categorical columns as text: the references were written over text
    (the reader holds a few text columns as categoricals, gates/schema.py)."""
    kept = {c: str for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)}
    return frame.astype(kept)


def _text(values: list[str | None]) -> pd.Series:
    return rows_frame([{"request_id": v} for v in values], schema.REQUESTS, str)["request_id"]


@given(st.lists(IDS, max_size=30))
def test_codes_are_equal_for_equal_texts(values: list[str | None]) -> None:
    codes = text_codes(_text(values))
    for i, a in enumerate(values):
        assert (codes[i] == -1) == (a is None)
        for j, b in enumerate(values):
            if a is not None and b is not None:
                assert (codes[i] == codes[j]) == (a == b)


@given(st.lists(IDS, max_size=20), st.lists(IDS, max_size=20))
def test_first_index_maps_as_pandas_does(keys: list[str | None], table: list[str | None]) -> None:
    left, right = _text(keys), _text(table)
    first = right.reset_index(drop=True)
    expected = left.map(pd.Series(first.index, index=first).groupby(level=0, dropna=False).first())
    if right.isna().any():  # pandas maps a missing key to a missing entry
        expected = expected.where(left.notna(), float(np.flatnonzero(right.isna())[0]))
    assert first_index(left, right).tolist() == expected.fillna(-1).astype(int).tolist()


@given(st.lists(IDS, max_size=20), st.lists(IDS, max_size=20))
def test_one_dictionary_finds_what_the_texts_find(
    keys: list[str | None], table: list[str | None]
) -> None:
    left, right = _text(keys), _text(table)
    coded_left, coded_right = one_dictionary(left, right)
    assert coded_left.dtype is coded_right.dtype
    assert coded_left.astype(str).tolist() == left.tolist()  # NaN stays NaN
    assert first_index(coded_left, coded_right).tolist() == first_index(left, right).tolist()
    for allowed in (coded_right, coded_right.unique(), coded_right.iloc[:0]):
        expected = isin(left, np.asarray(allowed.astype(str), dtype=object))
        assert isin(coded_left, allowed).tolist() == expected.tolist()
    (a, b), texts = shared_codes(coded_left, coded_right)
    for codes, values in ((a, keys), (b, table)):
        assert [None if c < 0 else texts[c] for c in codes] == values


@given(st.lists(st.tuples(IDS, REPLICAS), max_size=30))
def test_pair_codes_are_equal_for_equal_pairs(pairs: list[tuple[str | None, str | None]]) -> None:
    (ids, replicas), texts = shared_codes(
        _text([p[0] for p in pairs]), _text([p[1] for p in pairs])
    )
    codes = pair_codes(ids, replicas, len(texts))
    for i, a in enumerate(pairs):
        for j, b in enumerate(pairs):
            assert (codes[i] == codes[j]) == (a == b)


@given(st.lists(st.tuples(IDS, st.sampled_from([200.0, 503.0, np.nan])), max_size=30))
def test_per_distinct_is_the_function_row_by_row(rows: list[tuple[str | None, float]]) -> None:
    frame = pd.DataFrame(
        {"request_id": _text([r[0] for r in rows]), "status": [r[1] for r in rows]}
    )

    def label(part: pd.DataFrame) -> pd.Series:
        return part["request_id"].astype(str) + " " + part["status"].astype(str)

    pd.testing.assert_series_equal(
        per_distinct(frame, ["request_id", "status"], label), label(frame)
    )


# codes of a dictionary (counted in an array), and keys too far apart for one (hashed)
NARROW = st.integers(-1, 5)
WIDE = st.sampled_from([-(2**40), -1, 0, 7, 2**33, 2**40])


@given(
    st.one_of(
        st.tuples(st.lists(NARROW, max_size=40), st.lists(NARROW, max_size=10)),
        st.tuples(st.lists(WIDE, max_size=40), st.lists(WIDE, max_size=10)),
    )
)
def test_numbered_and_members_as_sorting_finds_them(drawn: tuple[list[int], list[int]]) -> None:
    keys, allowed = drawn
    values = np.array(keys, dtype=np.int64)
    number, first = numbered(values)
    _, expected_first = np.unique(values, return_index=True)
    assert np.array_equal(first, np.sort(expected_first))
    assert np.array_equal(values[first][number], values)
    found = members(values, np.array(allowed, dtype=np.int64))
    assert np.array_equal(found, np.isin(values, allowed))


def test_per_distinct_with_more_combinations_than_an_integer_holds() -> None:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({f"c{i}": rng.integers(0, 300, 2000) for i in range(8)})

    def label(part: pd.DataFrame) -> pd.Series:
        return part.astype(str).agg("/".join, axis=1)

    pd.testing.assert_series_equal(per_distinct(frame, list(frame.columns), label), label(frame))


# -- the metrics, against the formulations they replaced ---------------------------------


@st.composite
def event_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    row = st.fixed_dictionaries(
        {
            "request_id": IDS,
            "replica": REPLICAS,
            "event": KINDS,
            "t": TIMES,
            "seq": st.sampled_from([0, 1, 2, -1, None]),
            "blocks": st.sampled_from([0, 4, None]),
            "priority": st.sampled_from(["critical", "batch", None]),
            "used_tokens": st.sampled_from([10, 40, None]),
            "reserved_tokens": st.sampled_from([0, 32, None]),
        }
    )
    return draw(st.lists(row, max_size=40))


@st.composite
def request_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    row = st.fixed_dictionaries(
        {
            "request_id": IDS,
            "replica": REPLICAS,
            "cancel_at": TIMES,
            "t_send": st.sampled_from([T0, T0 + 1, None]),
            "ttft_s": st.sampled_from([0.25, None]),
            "e2e_s": st.sampled_from([2.0, None]),
            "prompt_tokens": st.sampled_from([100, None]),
            "target_prompt_tokens": st.sampled_from([90, None]),
            "traffic_class": st.sampled_from(["short_qa", "batch"]),
            "priority": st.sampled_from(["critical", "batch"]),
            "tenant": st.just("acme"),
            "outcome": st.sampled_from(["ok", "cancelled", "error", "rejected"]),
            "http_status": st.sampled_from([200, 503, None]),
            "error_code": st.sampled_from(["replica_failed", None]),
            "error_message": st.sampled_from(["out of memory", None]),
            "chunks": st.sampled_from([0, 3, None]),
            "max_tokens": st.sampled_from([0, 16, None]),
        }
    )
    return draw(st.lists(row, max_size=20))


@pytest.fixture(scope="module")
def empty_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    builder = RunBuilder()
    builder.fault(3.0, target="r1", t_end=3.5)  # a kill: a death after some cancels
    return builder.write(tmp_path_factory.mktemp("run"))


# Request ids as the reader codes them (one dictionary for both tables), or as text.
AS_READ = pytest.mark.parametrize("as_read", [True, False], ids=["as-read", "text"])


def _tables(
    events: list[dict[str, Any]], requests: list[dict[str, Any]], as_read: bool
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(server_events, requests) typed as the reader types them."""
    event_frame = rows_frame(events, schema.SERVER_EVENTS, str)
    request_frame = rows_frame(requests, schema.REQUESTS, str)
    if as_read:
        share_dictionaries(request_frame, event_frame)
    return event_frame, request_frame


def _run(
    path: Path, events: list[dict[str, Any]], requests: list[dict[str, Any]], as_read: bool
) -> RunData:
    run = load_run(path)
    run.server_events, run.requests = _tables(events, requests, as_read)
    return run


def _text_run(run: RunData) -> RunData:
    """`run` with every categorical column as text, for the references."""
    return dataclasses.replace(
        run,
        requests=_as_text(run.requests),
        server_events=_as_text(run.server_events),
        cache={},
    )


@AS_READ
@EXAMPLES
@given(event_rows())
def test_waiting_spans_as_before(
    empty_run: Path, as_read: bool, events: list[dict[str, Any]]
) -> None:
    frame = _tables(events, [], as_read)[0]
    order = ["request_id", "t0", "t1"]
    expected = _reference_waiting_spans(_as_text(frame), T0 + 100)
    expected = expected.sort_values(order, ignore_index=True)
    found = _as_text(waiting_spans(frame, T0 + 100)).sort_values(order, ignore_index=True)
    # the same spans (their order says nothing); the text columns stay text where pandas
    # made a column with no text at all, or none left, of type object
    pd.testing.assert_frame_equal(found, expected, check_index_type=False, check_dtype=False)


# Every id missing: admissions that name no request, and a cancellation no event names
# (once an IndexError, when no request id was admitted at all).
NO_IDS_ADMITTED = {"request_id": None, "replica": "r0", "event": "admitted", "t": T0, "seq": 0}
NO_IDS_CANCELLED = {
    "request_id": None,
    "replica": "r0",
    "cancel_at": T0,
    "t_send": T0,
    "traffic_class": "short_qa",
    "priority": "critical",
    "tenant": "acme",
    "outcome": "ok",
}


@AS_READ
@EXAMPLES
@given(event_rows(), request_rows(), st.sampled_from([0.0, 0.5]))
@example(events=[NO_IDS_ADMITTED, NO_IDS_ADMITTED], requests=[NO_IDS_CANCELLED], skew=0.0)
def test_cancel_release_as_before(
    empty_run: Path,
    as_read: bool,
    events: list[dict[str, Any]],
    requests: list[dict[str, Any]],
    skew: float,
) -> None:
    run = _run(empty_run, events, requests, as_read)
    if not run.server_events["event"].eq(EventKind.ADMITTED).any():
        return  # the histogram fallback, which did not change
    params = {"skew_s": skew}
    found = cancel_release_latency(run, GateFilter(), params)
    expected = _reference_cancel_release(_text_run(run), params)
    assert found.notes == expected.notes and found.missing == expected.missing
    pd.testing.assert_frame_equal(_as_text(found.frame), _as_text(expected.frame))


@AS_READ
@EXAMPLES
@given(event_rows())
def test_release_by_holder_as_before(
    empty_run: Path, as_read: bool, events: list[dict[str, Any]]
) -> None:
    run = _run(empty_run, events, [], as_read)
    found = release_by_holder(run)
    expected = _reference_foreign_releases(_as_text(run.server_events))
    assert [list(f.rows) for f in found] == ([list(expected.index)] if len(expected) else [])


@AS_READ
@EXAMPLES
@given(event_rows())
def test_double_holds_look_at_every_request_held_twice(
    empty_run: Path, as_read: bool, events: list[dict[str, Any]]
) -> None:
    frame = _tables(events, [], as_read)[0]
    held = frame.loc[frame["request_id"].notna(), ["request_id", "replica", "t"]]
    # what the group-by on (request, replica) that follows counts as held twice
    text = _as_text(held)
    expected = text.groupby("request_id")["replica"].transform("nunique").gt(1).to_numpy()
    assert np.array_equal(_on_two_replicas(held), expected)


@AS_READ
@EXAMPLES
@given(event_rows(), request_rows())
def test_clock_bounds_as_before(
    empty_run: Path, as_read: bool, events: list[dict[str, Any]], requests: list[dict[str, Any]]
) -> None:
    run = _run(empty_run, events, requests, as_read)
    # the same intervals, whatever their order (the reference's is by time, offset_intervals'
    # by table row); see test_waiting_spans_as_before on the text columns' type
    expected = _reference_offset_intervals(_text_run(run)).sort_values("row", ignore_index=True)
    found = _as_text(offset_intervals(run)).sort_values("row", ignore_index=True)
    pd.testing.assert_frame_equal(found, expected, check_dtype=False)


@AS_READ
@EXAMPLES
@given(event_rows(), request_rows())
def test_reservation_error_as_before(
    empty_run: Path, as_read: bool, events: list[dict[str, Any]], requests: list[dict[str, Any]]
) -> None:
    run = _run(empty_run, events, requests, as_read)
    expected = _reference_reservation_error(_text_run(run))
    found = _as_text(reservation_error(run))
    pd.testing.assert_frame_equal(found, expected, check_dtype=False)


@EXAMPLES
@given(request_rows())
def test_failure_label_as_before(empty_run: Path, requests: list[dict[str, Any]]) -> None:
    rows = rows_frame(requests, schema.REQUESTS, str)
    pd.testing.assert_series_equal(failure_label(rows), _reference_failure_label(_as_text(rows)))


def _reference_waiting_spans(events: pd.DataFrame, t_end: float) -> pd.DataFrame:
    starts_kinds = (EventKind.QUEUED, EventKind.PREEMPTED)
    ends_kinds = (
        EventKind.ADMITTED,
        EventKind.RESUMED,
        EventKind.REJECTED,
        EventKind.CANCELLED,
        EventKind.RELEASED,
        EventKind.FINISHED,
    )
    ev = events[events["event"].isin(starts_kinds + ends_kinds) & events["request_id"].notna()]
    if ev.empty:
        return pd.DataFrame(columns=["request_id", "priority", "t0", "t1"])
    ev = ev.sort_values(["request_id", "t", "seq"], kind="stable")
    starts = ev["event"].isin(starts_kinds).to_numpy()
    same = ev["request_id"].eq(ev["request_id"].shift(-1)).to_numpy()
    t1 = np.where(same, ev["t"].shift(-1).to_numpy(dtype=float), t_end)
    spans = pd.DataFrame(
        {
            "request_id": ev["request_id"].to_numpy(),
            "priority": ev["priority"].to_numpy(),
            "t0": ev["t"].to_numpy(dtype=float),
            "t1": t1,
        }
    )
    return spans[starts & (spans["t1"] > spans["t0"])]


def _reference_cancel_release(run: RunData, params: dict[str, float]) -> Observations:
    events = run.server_events
    skew = float(params["skew_s"])
    rows = run.requests[run.requests["cancel_at"].notna()]
    admitted = events[events["event"].eq(EventKind.ADMITTED) & events["request_id"].notna()]
    holders = admitted.sort_values("t", kind="stable").groupby("request_id")["replica"].last()
    rows = rows[isin(rows["request_id"], holders.index)]
    if rows.empty:
        return Observations.none(
            "no cancelled any request held a reservation, so release after cancel "
            "cannot be measured; the plan needs cancellations"
        )
    released = events.loc[events["event"].eq(EventKind.RELEASED), ["request_id", "replica", "t"]]
    held = rows[["request_id", "cancel_at"]].assign(replica=rows["request_id"].map(holders))
    joined = held.merge(released, on=["request_id", "replica"], how="left")
    late = joined[joined["t"] >= joined["cancel_at"] - skew]
    first_after = late.groupby("request_id", sort=False)["t"].min()
    any_release = joined.dropna(subset=["t"]).groupby("request_id", sort=False)["t"].size()
    ids = rows["request_id"]
    t_release = ids.map(first_after)
    released_before = t_release.isna() & ids.map(any_release).notna()
    unreleased = rows[t_release.isna() & ~released_before]
    deaths = pd.concat(
        [
            events.loc[events["event"].isin(DEATH_EVENTS), ["replica", "t"]],
            replica_deaths(run.faults)[["target", "t_start"]].rename(
                columns={"target": "replica", "t_start": "t"}
            ),
        ],
        ignore_index=True,
    ).dropna()
    death = pd.Series(np.nan, index=unreleased.index, dtype=float)
    if not deaths.empty:
        replica = unreleased["request_id"].map(holders)
        for i, (where, cancel_at) in enumerate(zip(replica, unreleased["cancel_at"], strict=True)):
            later = deaths.loc[deaths["replica"].eq(where) & (deaths["t"] >= cancel_at - skew), "t"]
            if not later.empty:
                death.iloc[i] = float(later.min())
    death = death.reindex(rows.index)
    by_death = t_release.isna() & ~released_before & death.notna()
    never = t_release.isna() & ~released_before & ~by_death
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
    holder_of = released["request_id"].map(holders)
    elsewhere = isin(released["request_id"], ids) & released["replica"].ne(holder_of)
    if elsewhere.any():
        notes.append(
            f"{int(elsewhere.sum())} releases of these requests were logged by a replica other "
            "than the one that last admitted them, and free nothing there"
        )
    return Observations(frame=frame, n_samples=len(rows), notes=notes)


def _reference_foreign_releases(events: pd.DataFrame) -> pd.DataFrame:
    mine = events[events["request_id"].notna()]
    released = mine[mine["event"].eq(EventKind.RELEASED)]
    keys = ["request_id", "replica"]
    holding = (str(EventKind.ADMITTED), str(EventKind.RESUMED))
    held = mine.loc[mine["event"].isin(holding), keys].drop_duplicates()
    seen = mine.loc[~mine["event"].eq(EventKind.RELEASED), keys].drop_duplicates()
    on = pd.MultiIndex.from_frame(released[keys].astype(str))
    never_held = ~on.isin(pd.MultiIndex.from_frame(held.astype(str)))
    queued_only = (
        on.isin(pd.MultiIndex.from_frame(seen.astype(str))) & ~released["blocks"].gt(0).to_numpy()
    )
    return released[never_held & ~queued_only]


def _reference_offset_intervals(run: RunData) -> pd.DataFrame:
    events = run.server_events
    server_rows = ~events["seq"].lt(0)
    entry = events[server_rows & events["event"].isin(ENTRY_EVENTS) & events["request_id"].notna()]
    if entry.empty:
        return pd.DataFrame(columns=["replica", "request_id", "lo", "hi", "row"])
    ordered = entry.sort_values("t", kind="stable")
    first = ordered.drop_duplicates(["replica", "request_id"])
    first = first[["replica", "request_id", "t"]].assign(row=first.index)
    sent = run.requests.dropna(subset=["t_send"])
    sent = sent[["request_id", "t_send", "ttft_s", "e2e_s", "cancel_at", "http_status"]]
    pairs = first.merge(sent.drop_duplicates("request_id"), on="request_id", how="inner")
    t_send = pairs["t_send"].to_numpy(dtype=float)
    answered = pairs["http_status"].notna().to_numpy()
    end = t_send + pairs["e2e_s"].to_numpy(dtype=float, na_value=np.nan)
    end = np.where(answered, np.fmin(end, pairs["cancel_at"].to_numpy(dtype=float)), np.nan)
    one_replica = ~pairs["request_id"].duplicated(keep=False).to_numpy()
    first_token = np.where(one_replica, t_send + pairs["ttft_s"].to_numpy(dtype=float), np.nan)
    seen = np.fmin(first_token, end)
    t = pairs["t"].to_numpy(dtype=float)
    return pd.DataFrame(
        {
            "replica": pairs["replica"].astype(str).to_numpy(),
            "request_id": pairs["request_id"].to_numpy(),
            "lo": np.where(np.isnan(seen), -np.inf, t - seen),
            "hi": t - t_send,
            "row": pairs["row"].to_numpy(),
        }
    )


def _reference_reservation_error(run: RunData) -> pd.DataFrame:
    ev = run.server_events
    ev = ev[ev["request_id"].notna() & ev["used_tokens"].notna()]
    admitted = ev[ev["event"].eq(EventKind.ADMITTED) & ev["reserved_tokens"].gt(0)]
    if admitted.empty:
        return pd.DataFrame(columns=["request_id", "prompt", "reserved", "used", "error"])
    first = admitted.drop_duplicates("request_id")[["request_id", "used_tokens", "reserved_tokens"]]
    peak = ev.groupby("request_id", sort=False)["used_tokens"].max()
    out = first.rename(columns={"used_tokens": "prompt", "reserved_tokens": "reserved"})
    req = run.requests.drop_duplicates("request_id").set_index("request_id")
    length = req["prompt_tokens"].fillna(req["target_prompt_tokens"])
    out["prompt"] = out["request_id"].map(length).fillna(out["prompt"]).to_numpy()
    out["used"] = out["request_id"].map(peak).to_numpy()
    out["error"] = out["used"] / out["reserved"] - 1.0
    return out.reset_index(drop=True)


def _reference_failure_label(rows: pd.DataFrame) -> pd.Series:
    if rows.empty:
        return pd.Series([], dtype=object)
    status = rows["http_status"].map(lambda s: "" if pd.isna(s) else f"HTTP {int(s)} ").astype(str)
    code = rows["error_code"].mask(answered_empty_rows(rows), EMPTY).fillna("").astype(str)
    message = rows["error_message"].fillna("").astype(str).str.slice(0, 80)
    return (
        status + rows["outcome"].astype(str) + " " + code.where(code.ne(""), message)
    ).str.strip()


def test_ids_arrow_cannot_read_as_text_are_still_looked_up() -> None:
    # a hand-built table may hold numbers beside text: Arrow refuses to make one column of
    # them, and pandas' own lookup answers instead (a missing id is in no set)
    ids = pd.Series([1, "a", None, 2.5], dtype=object)
    assert isin(ids, np.array(["a", 1], dtype=object)).tolist() == [True, True, False, False]


STATUSES = st.lists(st.tuples(IDS, st.sampled_from([200.0, 503.0, np.nan])), max_size=30)


def _statuses(rows: list[tuple[str | None, float]]) -> pd.DataFrame:
    return pd.DataFrame({"request_id": _text([r[0] for r in rows]), "status": [r[1] for r in rows]})


def _status_label(part: pd.DataFrame) -> pd.Series:
    # "a"/200 and "a"/503 read alike: their counts add up
    return part["request_id"].astype(str) + " " + part["status"].ge(500).astype(str)


@given(STATUSES)
def test_distinct_counts_are_the_value_counts(rows: list[tuple[str | None, float]]) -> None:
    frame = _statuses(rows)
    expected = per_distinct(frame, ["request_id", "status"], _status_label).value_counts()
    found = distinct_counts(frame, ["request_id", "status"], _status_label)
    pd.testing.assert_series_equal(found, expected)


@given(STATUSES)
def test_distinct_categories_group_as_the_text_does(rows: list[tuple[str | None, float]]) -> None:
    frame = _statuses(rows)
    text = per_distinct(frame, ["request_id", "status"], _status_label)
    coded = distinct_categories(frame, ["request_id", "status"], _status_label)
    assert coded.astype(str).tolist() == text.tolist()  # NaN stays NaN
    expected = frame["status"].groupby(text).size()
    found = frame["status"].groupby(coded, observed=True).size()
    assert found.index.astype(str).tolist() == expected.index.tolist()
    assert found.tolist() == expected.tolist()


@given(
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, 1.0, 2.5, np.nan])), max_size=30)
)
def test_in_time_is_what_a_stable_sort_by_time_finds(rows: list[tuple[int, float]]) -> None:
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    t = np.array([r[1] for r in rows], dtype=float)
    order = np.argsort(t, kind="stable")  # NaN last, ties in table order
    expected_first, expected_last = np.full(4, -1), np.full(4, -1)
    for position in order[::-1]:
        expected_first[ids[position]] = position
    for position in order:
        expected_last[ids[position]] = position
    assert in_time(ids, t, 4, last=False).tolist() == expected_first.tolist()
    assert in_time(ids, t, 4, last=True).tolist() == expected_last.tolist()
