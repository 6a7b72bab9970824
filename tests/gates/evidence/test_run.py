"""The checks on the run as a whole (gates/evidence/checks_run.py): records from outside the
run's window, a run that did not finish, requests that cover less of the load than planned,
and tables with fewer rows than the run wrote. Also how the reader tells a user to recover
from an unreadable Parquet file without deleting what it holds."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gates.evaluator import evaluate
from gates.rundir import RunDirError, load_run
from gates.spec import GateFile
from gates.verdict import Status, Verdict
from tests.gates.builder import T0, RunBuilder, host_cpu
from tests.gates.conftest import gate
from tests.gates.evidence.conftest import Judge, clean, messages

# -- the run window ------------------------------------------------------------------------


def test_requests_from_outside_the_run_are_dropped_and_the_run_is_invalid(check: Judge) -> None:
    b = clean()
    b.request("stale-1", t=-3600, ttft_s=5.0, e2e_s=6.0, chunks=5)
    b.request("stale-2", t=-3500, ttft_s=5.0, e2e_s=6.0, chunks=5)
    b.request("edge", t=124, ttft_s=0.1, e2e_s=0.3, chunks=5)  # within the slack of t_end
    verdict = check(b)
    assert verdict.status == Status.INVALID
    assert gate(verdict, "ttft_p95").n_samples == 101
    [message] = messages(verdict, "run_window")
    assert message.startswith(
        "2 request(s) sent outside the run's window [1000000.000, 1000120.000], up to 3600 s "
        "before it: records of another run"
    )
    assert verdict.evidence["findings"][0]["rows"] == [100, 101]


def test_a_long_lived_servers_events_from_before_the_run_are_left_out_with_a_note(
    check: Judge,
) -> None:
    """An external server shows its whole event log from the first read: an OOM an hour
    before this run began is not this run's, and today it fails no_oom."""
    b = clean()
    b.event("oom", -3600, request_id=None)
    b.event("admitted", -3601, request_id="an-earlier-runs")
    verdict = check(b)
    assert gate(verdict, "no_oom").status == Status.PASS
    assert verdict.status == Status.PASS
    [note] = messages(verdict, "run_window")
    assert note.startswith("2 server event(s) outside the run's window")
    assert "about none of its requests" in note and "were left out" in note


def test_an_event_of_the_runs_own_request_outside_the_window_makes_it_invalid(
    check: Judge,
) -> None:
    b = clean()
    b.event("released", 200, request_id="r3")
    verdict = check(b)
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "run_window")
    assert "1 server event(s) about the run's own requests lie outside its window" in message
    assert "up to 80 s after it" in message and "sync the hosts' clocks" in message


def test_samples_from_outside_the_window_are_left_out_with_a_note(check: Judge) -> None:
    b = (
        clean()
        .sample("kvgate_pool_used_blocks", 1.0, -600)
        .sample("kvgate_pool_used_blocks", 1, 50)
    )
    verdict = check(b)
    assert verdict.status == Status.PASS
    assert messages(verdict, "run_window") == [
        "1 sample(s) taken outside the run's window [1000000.000, 1000120.000], up to 600 s "
        "before it, were left out"
    ]


def test_a_run_without_its_edges_is_not_checked_against_them_and_says_so(check: Judge) -> None:
    b = clean()
    del b.meta["t_start"], b.meta["t_end"]
    verdict = check(b)
    assert verdict.status == Status.PASS
    assert any("gives no t_start and t_end" in n for n in verdict.notes)


# -- the run finished ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error", "said"),
    [
        ("interrupted", "interrupted (Ctrl-C)", "the run was interrupted (interrupted (Ctrl-C))"),
        ("error", "RuntimeError: boom", "ended in an error (RuntimeError: boom); harness-error"),
        ("running", None, "has not finished: meta.json says `running`"),
    ],
)
def test_a_run_that_did_not_complete_is_invalid_and_must_be_re_run(
    check: Judge, status: str, error: str | None, said: str
) -> None:
    b = clean()
    b.meta |= {"status": status, "error": error}
    verdict = check(b)
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "run_finished")
    assert said in message and message.endswith("re-run it")


def test_an_unfinished_run_whose_blocking_gate_failed_for_good_still_fails(check: Judge) -> None:
    b = clean().event("oom", 40, request_id=None)
    b.meta |= {"status": "interrupted", "error": "interrupted (Ctrl-C)"}
    verdict = check(b)
    assert gate(verdict, "no_oom").status == Status.FAIL
    assert verdict.status == Status.FAIL
    assert messages(verdict, "run_finished")


def test_a_completed_run_is_clean_and_one_without_status_gets_a_note(check: Judge) -> None:
    b = clean()
    b.meta["status"] = "completed"
    assert not messages(check(b), "run_finished")
    del b.meta["status"]
    [note] = messages(check(b), "run_finished")
    assert note.startswith("meta.json has no status (a run built by hand")


# -- the load covered ----------------------------------------------------------------------


def planned(b: RunBuilder, duration_s: float, **meta: object) -> RunBuilder:
    """The meta.json of a completed harness run whose plan held the load `duration_s`."""
    b.meta |= {
        "status": "completed",
        "plan": {"name": "p", "load": {"shape": "constant", "duration_s": duration_s}},
        "windows": {"stress": [T0 + 10, T0 + 10 + duration_s]},
        "t_end": T0 + 30 + duration_s,
        **meta,
    }
    return b


def test_requests_that_cover_a_tenth_of_the_planned_load_make_the_run_invalid(
    check: Judge,
) -> None:
    b = RunBuilder()
    for i in range(181):
        b.request(f"r{i}", t=10 + i * 0.5, ttft_s=0.1, e2e_s=0.3, chunks=5)
    verdict = check(planned(b, 900))
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "load_covered")
    assert message.startswith(
        "the requests cover 90 s of 900 s planned (from +0 s to +90 s of the load): the "
        "records of the rest are missing"
    )
    assert check(planned(b, 100)).status == Status.PASS  # 90 s of 100: a user's last wait


def test_a_few_users_with_long_answers_cover_the_load_while_their_requests_are_in_flight(
    check: Judge,
) -> None:
    """Closed-loop users send their next request when the last is answered: three sends in
    120 s of load, 40 s apart, are a load that never paused."""
    b = RunBuilder()
    for i in range(100):
        b.request(f"r{i}", t=10 + 40 * (i % 3), ttft_s=0.5, e2e_s=39.0, chunks=100)
    verdict = check(planned(b, 120))
    assert verdict.status == Status.PASS
    assert not messages(verdict, "load_covered")
    clean = [c["name"] for c in verdict.evidence["checks"] if c["clean"]]
    assert clean[clean.index("load_covered") :][:2] == ["load_covered", "tables_complete"]


@pytest.mark.parametrize(
    "meta",
    [
        {"load_generator": {"stopped_early": "stopped from the web page"}},
        {"capacity": {"stop_reason": "rejections"}},
    ],
)
def test_a_load_that_stopped_early_for_a_stated_reason_is_held_to_how_long_it_ran(
    check: Judge, meta: dict[str, object]
) -> None:
    b = RunBuilder()
    for i in range(181):
        b.request(f"r{i}", t=10 + i * 0.5, ttft_s=0.1, e2e_s=0.3, chunks=5)
    planned(b, 900, **meta)
    b.meta["windows"] = {"stress": [T0 + 10, T0 + 100]}
    assert not messages(check(b), "load_covered")
    b.meta["windows"] = {"stress": [T0 + 10, T0 + 400]}  # it ran 390 s, the records cover 90
    [message] = messages(check(b), "load_covered")
    assert "cover 90 s of the 390 s the load ran (" in message


# -- the tables complete -------------------------------------------------------------------


def test_rows_missing_against_meta_tables_make_the_run_invalid(
    tmp_path: Path, small_gates: GateFile
) -> None:
    b = clean()
    counts = {name: len(rows) for name, rows in b.rows.items()}
    b.meta["tables"] = counts | {"requests": 140}
    verdict = evaluate(load_run(b.write(tmp_path / "run", fmt="parquet")), small_gates)
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "tables_complete")
    assert message.startswith(
        "table requests is incomplete: meta.json counts 140 rows (meta.tables, at compaction) "
        "but 100 were read, 40 missing (read from parquet)"
    )


def test_a_damaged_parquet_file_says_how_to_recover_without_deleting_it(
    tmp_path: Path, small_gates: GateFile
) -> None:
    b = clean()
    b.meta["tables"] = {name: len(rows) for name, rows in b.rows.items()}
    run = b.write(tmp_path / "run", fmt="parquet")
    damaged = run / "requests.parquet"
    damaged.write_bytes(damaged.read_bytes()[:50])
    with pytest.raises(RunDirError) as caught:
        load_run(run)
    text = str(caught.value)
    assert "delete" not in text.replace("do not delete it", "")
    assert "do not delete it, its rows are nowhere else: restore it from a copy of the run" in text
    assert "rename it to requests.parquet.damaged to judge what is left" in text
    damaged.rename(run / "requests.parquet.damaged")
    verdict = evaluate(load_run(run), small_gates)
    assert verdict.status == Status.INVALID
    [message] = messages(verdict, "tables_complete")
    assert "0 were read, 100 missing (requests.parquet is missing)" in message
    assert "requests.parquet.damaged was set aside as damaged (.damaged)" in message


def write_part(run: Path, table: str, n: int, rows: list[dict[str, object]]) -> None:
    name = run / f"{table}.part-{n:05d}.parquet"
    pd.DataFrame(rows).to_parquet(name, index=False)


def test_a_part_missing_from_a_crashed_run_is_named(tmp_path: Path, small_gates: GateFile) -> None:
    """A run that died before compaction: its tables are parts and live JSON lines, and
    meta.json has no counts. A gap in the parts' numbers is rows lost."""
    b = clean()
    run = b.write(tmp_path / "run")
    requests = b.rows["requests"]
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests[75:]))
    write_part(run, "requests", 1, requests[:25])
    write_part(run, "requests", 3, requests[50:75])
    verdict = evaluate(load_run(run), small_gates)
    [message] = messages(verdict, "tables_complete")
    assert message.startswith(
        "table requests is incomplete: 1 part(s) of 1..3 are missing "
        "(requests.part-00002.parquet), each up to 200,000 rows"
    )
    assert verdict.status == Status.INVALID


def test_an_unreadable_part_whose_json_lines_remain_says_to_read_those(tmp_path: Path) -> None:
    run = clean().write(tmp_path / "run")
    (run / "requests.part-00001.parquet").write_bytes(b"PAR1 cut short")
    (run / "requests.part-00001.jsonl").write_text("")
    with pytest.raises(RunDirError) as caught:
        load_run(run)
    text = str(caught.value)
    assert "its JSON lines are still beside it (the conversion was cut short)" in text
    assert "rename it to requests.part-00001.parquet.damaged and the reader reads" in text
    (run / "requests.part-00001.parquet").rename(run / "requests.part-00001.parquet.damaged")
    data = load_run(run)
    assert data.parts["requests"] == (1,) and data.set_aside["requests"] == (
        "requests.part-00001.parquet.damaged",
    )


def test_a_harness_run_that_is_whole_has_no_finding(tmp_path: Path, small_gates: GateFile) -> None:
    b = host_cpu(planned(clean(), 50), lambda t: 0.05, span=(20, 70))  # on a quiet host
    b.meta["windows"] = {"stress": [T0 + 20, T0 + 70]}
    b.meta["tables"] = {name: len(rows) for name, rows in b.rows.items()}
    verdict: Verdict = evaluate(load_run(b.write(tmp_path / "run", fmt="parquet")), small_gates)
    assert verdict.status == Status.PASS
    assert verdict.evidence["findings"] == []
    assert [c["name"] for c in verdict.evidence["checks"]][-7:] == [
        "run_window",
        "run_finished",
        "load_covered",
        "tables_complete",
        "host_contention",
        "loop_kept_up",
        "schedule_kept",
    ]
