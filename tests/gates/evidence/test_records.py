"""The checks on single records (gates/evidence/checks_records.py): values outside the
contract's domains and impossible numbers are refused, naming table, column and rows;
records written twice are judged once and make the run INVALID."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates.cli import main
from gates.evidence import EvidenceRefused
from gates.evidence.checks_records import _any_repeated
from gates.rundir import rows_frame, share_dictionaries
from gates.verdict import Status, Verdict
from tests.gates.builder import RunBuilder
from tests.gates.conftest import gate
from tests.gates.evidence.conftest import Judge, clean, messages


def refused(check: Judge, b: RunBuilder) -> str:
    with pytest.raises(EvidenceRefused) as caught:
        check(b)
    return str(caught.value)


def ran_clean(verdict: Verdict, check: str) -> bool:
    """Whether `check` ran over the run and found nothing."""
    return any(c["name"] == check and c["clean"] for c in verdict.evidence["checks"])


def test_the_clean_run_passes_every_check_of_its_records(check: Judge) -> None:
    verdict = check(clean())
    assert verdict.status == Status.PASS
    assert all(ran_clean(verdict, c) for c in ("enum_domains", "value_ranges", "unique_records"))


# -- enum domains --------------------------------------------------------------------------


def test_a_priority_that_differs_only_by_case_is_refused_with_a_hint(check: Judge) -> None:
    b = clean()
    for i in (3, 7):
        b.rows["requests"][i]["priority"] = "Critical"
    b.rows["requests"][9]["priority"] = "urgent"
    text = refused(check, b)
    assert (
        "requests.priority holds 3 value(s) that are not a contract.Priority: "
        "'Critical' (rows 3, 7; did you mean 'critical'?), 'urgent' (row 9); "
        "allowed: critical, interactive, batch [requests.priority, rows 3, 7, 9]"
    ) in text


@pytest.mark.parametrize(
    ("table", "column", "value", "hint"),
    [
        ("requests", "traffic_class", "short-qa", "short_qa"),
        ("requests", "outcome", "OK", "ok"),
        ("server_events", "event", "Admitted", "admitted"),
        ("server_events", "event", "evicted", None),
        ("server_events", "priority", "urgent", None),
    ],
)
def test_values_outside_the_contract_are_refused_naming_table_column_and_row(
    check: Judge, table: str, column: str, value: str, hint: str | None
) -> None:
    b = clean()
    b.rows[table][4][column] = value
    text = refused(check, b)
    assert f"{table}.{column} holds 1 value(s) that are not" in text
    assert f"{value!r} (row 4" in text and f"[{table}.{column}, row 4]" in text
    assert (f"did you mean {hint!r}?" in text) == (hint is not None)


def test_an_engines_own_integer_priority_is_in_its_domain_only_where_its_profile_has_one(
    check: Judge,
) -> None:
    """vLLM's recorder names the priority each request ran at by the profile's mapping, and
    keeps an integer nobody mapped (another client's request) as its number."""
    b = clean()
    b.event("admitted", 30, request_id="someone-elses", priority="7")
    assert "'7' (row 200)" in refused(check, b)  # the reference server has no such field
    b.meta["target"]["kind"] = "vllm"
    assert check(b).status == Status.PASS
    b.rows["server_events"][-1]["priority"] = "seven"
    assert "or an integer priority of vllm's own: 'seven'" in refused(check, b)


def test_kvgate_gate_exits_2_on_a_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = clean()
    b.rows["requests"][2]["traffic_class"] = "Batch"
    assert main([str(b.write(tmp_path / "run")), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "breaks its contract; nothing was judged" in err
    assert "'Batch' (row 2; did you mean 'batch'?)" in err
    assert not (tmp_path / "run" / "verdict.json").exists()


# -- value ranges --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "column", "shown"),
    [
        (
            {"ttft_s": -0.1},
            "ttft_s",
            "is negative: no time from a request's send can be: row 5: -0.1",
        ),
        ({"e2e_s": -1.0, "ttft_s": None}, "e2e_s", "is negative"),
        ({"itl_p99_s": -0.01}, "itl_p99_s", "row 5: -0.01"),
        ({"retry_after_s": -2.0}, "retry_after_s", "no wait can be: row 5: -2"),
        ({"chunks": -1}, "chunks", "no count can be: row 5: -1"),
        ({"completion_tokens": -5}, "completion_tokens", "row 5: -5"),
        ({"cached_tokens": -1}, "cached_tokens", "row 5: -1"),
        (
            {"ttft_s": 2.0, "e2e_s": 1.0},
            "ttft_s",
            "is later than e2e_s: the first token came "
            "after the request had ended: row 5: 2 (e2e_s 1)",
        ),
        (
            {"ttft_s": None, "chunks": 3},
            "ttft_s",
            "streamed content: its first token came, so "
            "its writer knew when: row 5: null (chunks 3)",
        ),
        ({"t_send": None}, "t_send", "is not a finite time: row 5: null"),
        ({"http_status": 700}, "http_status", "is no HTTP status (100..599): row 5: 700"),
        ({"http_status": 42}, "http_status", "row 5: 42"),
    ],
)
def test_impossible_numbers_are_refused_naming_the_row_and_value(
    check: Judge, fields: dict[str, Any], column: str, shown: str
) -> None:
    b = clean()
    b.rows["requests"][5] |= fields
    text = refused(check, b)
    assert f"value_ranges: requests.{column} " in text and shown in text
    assert f"[requests.{column}, row 5]" in text
    if column == "retry_after_s":
        assert "(as the client recorded it from the Retry-After header the server sent)" in text


def test_what_is_possible_is_not_refused(check: Judge) -> None:
    """A first token within a millisecond of the end (a writer that rounds), no first token
    on an answer without content or on one that failed, and no status on a broken
    connection are all records kvgate's own writer makes."""
    b = clean()
    b.rows["requests"][1] |= {"ttft_s": 0.3004, "e2e_s": 0.3}
    b.rows["requests"][2] |= {"ttft_s": None, "chunks": 0}
    b.rows["requests"][3] |= {"ttft_s": None, "chunks": 2, "outcome": "cancelled"}
    b.rows["requests"][4] |= {"ttft_s": None, "http_status": None, "outcome": "disconnected"}
    verdict = check(b)
    assert ran_clean(verdict, "value_ranges")
    assert gate(verdict, "availability").n_samples == 99  # the cancel is left out


# -- uniqueness ----------------------------------------------------------------------------


def test_a_request_written_twice_is_judged_once_and_the_run_is_invalid(check: Judge) -> None:
    b = clean()
    b.rows["requests"] += [dict(b.rows["requests"][i]) for i in (10, 11, 10)]
    verdict = check(b)
    assert verdict.status == Status.INVALID
    assert gate(verdict, "ttft_p95").n_samples == 100
    [message] = messages(verdict, "unique_records")
    assert message.startswith(
        "3 requests row(s) written twice (exact copies of an earlier row, 2 request(s)): each "
        "was judged once, but a writer that duplicates records may have lost others"
    )
    finding = verdict.evidence["findings"][0]
    assert finding["rows"] == [100, 101, 102] and finding["table"] == "requests"


def test_conflicting_rows_of_one_request_keep_the_first_and_name_both(check: Judge) -> None:
    b = clean()
    b.request("r5", t=30, outcome="error", http_status=500, e2e_s=0.3, chunks=0, replica="r0")
    verdict = check(b)
    assert verdict.status == Status.INVALID
    assert gate(verdict, "availability").value == 1.0  # the first row, ok, was judged
    [message] = messages(verdict, "unique_records")
    assert (
        "1 request(s) recorded more than once with different contents: r5 in rows 5, 100 "
        "(differing in t_send, ttft_s, chunks, outcome, http_status). The first row of each "
        "was judged and 1 later row(s) dropped"
    ) in message


def test_a_server_event_is_one_replica_and_seq_but_the_harness_rows_may_repeat(
    check: Judge,
) -> None:
    b = clean()
    b.event("replica_started", 1, replica="r0", seq=-1, request_id=None)
    b.event("replica_started", 1, replica="r1", seq=-1, request_id=None)
    b.event("replica_started", 2, replica="r0", seq=-1, request_id=None)  # another sampler
    assert check(b).status == Status.PASS
    b.rows["server_events"].append(dict(b.rows["server_events"][7]))
    b.event("finished", 40, replica="r0", seq=3, request_id="r1")
    verdict = check(b)
    assert verdict.status == Status.INVALID
    exact, clash = messages(verdict, "unique_records")
    assert exact.startswith("1 server_events row(s) written twice")
    assert "1 event(s) recorded more than once with different contents: r0/3 in rows 3, 204" in (
        clash
    )


def test_rows_the_sink_dropped_are_no_finding(check: Judge) -> None:
    b = clean()
    b.meta["records"] = {"written": 100, "duplicates_dropped": 4}
    verdict = check(b)
    assert ran_clean(verdict, "unique_records") and verdict.status == Status.PASS


# -- the keys compared as integers ----------------------------------------------------------

EVENT_KEYS = st.tuples(st.sampled_from(["r0", "r1", None]), st.sampled_from([0, 1, 2, 5, -1]))


@given(st.lists(EVENT_KEYS, max_size=25), st.booleans())
def test_repeated_keys_are_found_as_pandas_finds_them(
    keys: list[tuple[str | None, int]], as_read: bool
) -> None:
    rows = [
        {"request_id": f"q{seq}", "replica": replica, "seq": seq, "event": "admitted", "t": 1.0}
        for replica, seq in keys
    ]
    events = rows_frame(rows, "server_events", str)
    requests = rows_frame([{"request_id": r["request_id"]} for r in rows], "requests", str)
    if as_read:
        share_dictionaries(requests, events)
    for frame, key, keyed in (
        (events, ["replica", "seq"], events["replica"].notna() & (events["seq"] >= 0)),
        (requests, ["request_id"], requests["request_id"].notna()),
    ):
        expected = bool((frame.duplicated(subset=key, keep=False) & keyed).any())
        assert _any_repeated(frame, key, keyed.to_numpy()) == expected
