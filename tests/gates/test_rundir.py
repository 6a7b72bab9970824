"""Reading run directories: Parquet first, JSON lines after, a crash's cut-off last line dropped,
every value checked against its column's type and never coerced."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gates import schema
from gates.rundir import RunDirError, load_run
from harness.rundir import compact
from tests.gates.builder import RunBuilder


def test_truncated_last_jsonl_line_is_dropped(tmp_path: Path) -> None:
    path = RunBuilder().request("a", ttft_s=0.1).request("b", ttft_s=0.2).write(tmp_path / "run")
    with (path / "requests.jsonl").open("a") as f:
        f.write('{"request_id": "c", "ttft_s": 0.')  # the crash cut this line short
    run = load_run(path)
    assert list(run.requests["request_id"]) == ["a", "b"]
    assert run.truncated_lines == {"requests": 1}


def test_a_bad_line_in_the_middle_is_an_error_naming_it(tmp_path: Path) -> None:
    path = RunBuilder().request("a").request("b").write(tmp_path / "run")
    lines = (path / "requests.jsonl").read_text().splitlines()
    (path / "requests.jsonl").write_text("\n".join([lines[0], "{oops", lines[1]]) + "\n")
    with pytest.raises(RunDirError, match=r"requests.jsonl:2"):
        load_run(path)


def test_parquet_is_preferred_and_missing_columns_are_added(tmp_path: Path) -> None:
    path = RunBuilder().request("from-parquet", ttft_s=0.1).write(tmp_path / "run", fmt="parquet")
    (path / "requests.jsonl").write_text('{"request_id": "from-jsonl"}\n')
    (path / "faults.jsonl").write_text('{"fault_id": "f1", "t_start": 12}\n')
    run = load_run(path)
    assert list(run.requests["request_id"]) == ["from-parquet"]
    assert run.sources["requests"] == "parquet" and run.sources["samples"] == "absent"
    assert run.faults["t_start"].iloc[0] == 12.0 and run.faults["t_start"].dtype == "float64"
    assert "itl_p99_s" in run.requests.columns and run.samples.empty


def test_missing_meta_or_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file, not a run directory"):
        load_run(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match=r"meta\.json is missing"):
        load_run(tmp_path / "empty")


def test_nullable_writer_dtypes_are_normalised(tmp_path: Path) -> None:
    """Int64 and pd.NA strings (as the harness's Parquet has) read like any other writer's."""
    path = RunBuilder().write(tmp_path / "run")
    frame = pd.DataFrame(
        {
            "request_id": pd.array(["a", "b"], dtype="string"),
            "priority": pd.array(["batch", None], dtype="string"),
            "t_send": [1.0, 2.0],
            "http_status": pd.array([503, None], dtype="Int64"),
            "outcome": pd.array(["rejected", None], dtype="string"),
            "retry_after_s": [1.0, None],
        }
    )
    frame.to_parquet(path / "requests.parquet", index=False)
    run = load_run(path)
    assert run.requests["http_status"].dtype == "float64"
    mask = run.requests["outcome"].eq("timeout") | run.requests["http_status"].isin((429, 503))
    assert list(run.requests[mask]["request_id"]) == ["a"]  # no ambiguous NA in the mask


# -- text with few values as categoricals, request ids over one dictionary ------------------


def _two_tables(b: RunBuilder) -> RunBuilder:
    b.request("r-2", tenant="globex", priority="batch", outcome="rejected", replica="r1")
    b.request("r-1", tenant="acme", priority="critical", outcome="ok", replica=None)
    b.event("admitted", 21.0, replica="r0", request_id="r-1", tenant="acme", priority="critical")
    b.event("queued", 22.0, replica="r2", request_id="r-3", tenant="initech", priority="batch")
    return b


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_few_valued_text_reads_as_sorted_categories(tmp_path: Path, fmt: str) -> None:
    run = load_run(_two_tables(RunBuilder()).write(tmp_path / "run", fmt=fmt))
    for table, columns in schema.CATEGORY_COLUMNS.items():
        for column in columns:
            values = run.table(table)[column]
            assert isinstance(values.dtype, pd.CategoricalDtype), (table, column)
            categories = list(values.cat.categories)
            assert categories == sorted(categories)
    assert list(run.requests["outcome"].astype(str)) == ["rejected", "ok"]
    assert run.requests["replica"].isna().tolist() == [False, True]
    # a column both tables hold has one dtype: its codes mean the same in either
    for column in ("replica", "tenant", "priority"):
        assert run.requests[column].dtype is run.server_events[column].dtype
    assert list(run.requests["replica"].cat.categories) == ["r0", "r1", "r2"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_request_ids_share_one_dictionary_across_tables(tmp_path: Path, fmt: str) -> None:
    run = load_run(_two_tables(RunBuilder()).write(tmp_path / "run", fmt=fmt))
    requests, events = run.requests["request_id"], run.server_events["request_id"]
    assert requests.cat.categories is events.cat.categories
    assert list(requests.astype(str)) == ["r-2", "r-1"]
    assert list(events.astype(str)) == ["r-1", "r-3"]
    assert events.cat.codes.iloc[0] == requests.cat.codes.iloc[1]  # r-1 in both


def test_compaction_writes_text_as_text(tmp_path: Path) -> None:
    """The reader's categoricals never reach a Parquet file: its column types stay text."""
    path = _two_tables(RunBuilder()).write(tmp_path / "run", fmt="jsonl")
    compact(path)
    stored = pq.read_schema(path / "requests.parquet")
    for column in ("request_id", "tenant", "outcome"):
        assert stored.field(column).type == pa.large_string()


# -- values of the wrong kind are refused, naming file, table, column and row ----------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("fast", "the text 'fast'"),
        ("0.25", "the text '0.25'"),  # a number written as text is still text
        ([0.1], "a list [0.1]"),
        ({"s": 0.1}, "an object"),
        (True, "the boolean true"),
        ("2026-01-01T00:00:00Z", "the text '2026-01-01T00:00:00Z'"),
    ],
)
def test_a_value_that_is_not_a_number_is_refused_not_coerced(
    tmp_path: Path, value: object, shown: str
) -> None:
    path = (
        RunBuilder()
        .request("a", ttft_s=0.1)
        .request("b", ttft_s=value)
        .request("c", ttft_s=0.3)
        .write(tmp_path / "run")
    )
    with pytest.raises(RunDirError) as caught:
        load_run(path)
    message = str(caught.value)
    assert "requests.jsonl:2: table 'requests', column 'ttft_s' expects a number" in message
    assert f"found {shown}" in message
    assert "null marks a missing value" in message  # and says what to do


def test_null_is_missing_not_an_error(tmp_path: Path) -> None:
    path = RunBuilder().request("a", ttft_s=None, chunks=None).request("b").write(tmp_path / "r")
    run = load_run(path)
    assert run.requests["ttft_s"].isna().tolist() == [True, True]
    assert run.requests["chunks"].isna().all()


def test_integer_columns_refuse_fractions_and_booleans(tmp_path: Path) -> None:
    path = RunBuilder().request("a", chunks=3.0).request("b", chunks=2.5).write(tmp_path / "r1")
    with pytest.raises(RunDirError, match=r"requests\.jsonl:2: .*'chunks' expects a whole number"):
        load_run(path)
    path = RunBuilder().event("admitted", t=20.0, blocks=False).write(tmp_path / "r2")
    with pytest.raises(RunDirError, match=r"server_events\.jsonl:1: .*'blocks'.*the boolean false"):
        load_run(path)


def test_text_columns_refuse_lists_and_objects_and_keep_numbers_as_their_digits(
    tmp_path: Path,
) -> None:
    # a number where text belongs, as a hand-written run directory might have it
    path = RunBuilder().sample("m", 1.0, t=5.0, target=4242).write(tmp_path / "ok")  # type: ignore[arg-type]
    assert load_run(path).samples["target"].tolist() == ["4242"]
    path = RunBuilder().request("a", tenant=["acme", "globex"]).write(tmp_path / "bad")
    with pytest.raises(RunDirError, match=r"column 'tenant' expects text, found a list"):
        load_run(path)


def test_a_line_that_is_not_an_object_is_an_error_naming_it(tmp_path: Path) -> None:
    path = RunBuilder().request("a").request("b").write(tmp_path / "run")
    lines = (path / "requests.jsonl").read_text().splitlines()
    (path / "requests.jsonl").write_text("\n".join([lines[0], "[1, 2]", lines[1]]) + "\n")
    with pytest.raises(RunDirError, match=r"requests\.jsonl:2 holds a list"):
        load_run(path)


def test_bad_utf8_is_an_error_unless_it_is_the_torn_last_line(tmp_path: Path) -> None:
    path = RunBuilder().request("a").request("b").write(tmp_path / "run")
    good = (path / "requests.jsonl").read_bytes()
    (path / "requests.jsonl").write_bytes(good + b'{"request_id": "c\xe2\x82')
    assert load_run(path).truncated_lines == {"requests": 1}
    first, second = good.splitlines()
    (path / "requests.jsonl").write_bytes(first + b"\n\xff\xfe\n" + second + b"\n")
    with pytest.raises(RunDirError, match=r"requests\.jsonl:2 is not a line of UTF-8 JSON"):
        load_run(path)


@pytest.mark.parametrize(
    ("column", "shown"),
    [
        (pa.array(["0.1", "fast"]), "the text '0.1'"),
        (pa.array([True, False]), "the boolean true"),
        (pa.array([datetime(2026, 1, 1), None], type=pa.timestamp("s")), "datetime"),
    ],
)
def test_parquet_columns_of_a_non_numeric_type_are_refused(
    tmp_path: Path, column: pa.Array[Any], shown: str
) -> None:
    path = RunBuilder().write(tmp_path / "run")
    table = pa.table({"request_id": ["a", "b"], "t_send": [1.0, 2.0], "ttft_s": column})
    pq.write_table(table, path / "requests.parquet")
    with pytest.raises(RunDirError) as caught:
        load_run(path)
    message = str(caught.value)
    assert "requests.parquet row 1: table 'requests', column 'ttft_s' expects a number" in message
    assert shown in message and "stored as" in message


def test_parquet_nested_text_column_is_refused(tmp_path: Path) -> None:
    path = RunBuilder().write(tmp_path / "run")
    table = pa.table({"request_id": ["a"], "tenant": pa.array([["acme"]])})
    pq.write_table(table, path / "requests.parquet")
    with pytest.raises(RunDirError, match=r"column 'tenant' expects text, found a list"):
        load_run(path)


# -- meta.json -------------------------------------------------------------------------------


def test_meta_with_bad_utf8_is_refused(tmp_path: Path) -> None:
    path = RunBuilder().write(tmp_path / "run")
    (path / "meta.json").write_bytes(b'{"harness_version": "caf\xe9"}')
    with pytest.raises(RunDirError, match=r"meta\.json is not UTF-8 \(byte 24"):
        load_run(path)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("t_end", "late", "t_end"),
        ("t_start", True, "t_start"),
        ("cpu_warning", "no", "cpu_warning"),
        ("sim_lag_ms_p99", "3", "sim_lag_ms_p99"),
        ("windows", {"stress": [1.0, "x"]}, "windows.stress[1]"),
        ("windows", {"stress": [1.0]}, "windows.stress[1]"),
        ("windows", [1.0, 2.0], "windows"),
        ("phases", [{"name": "peak", "t0": 1.0}], "phases[0].t1"),
        ("target", "reference", "target"),
        ("target", {"config": [0.15]}, "target.config"),
        ("target", {"kind": "reference", "replicas": 2}, "target.replicas"),
        ("status", "done", "status"),
        ("seed", "7", "seed"),
        ("hosts", ["localhost"], "hosts[0]"),
        ("records", {"written": "3"}, "records.written"),
        ("capacity", {"slo_broken_users": "40"}, "capacity.slo_broken_users"),
        ("aborted", {"gate": "no_oom", "at_s": 4.0}, "aborted.message"),
    ],
)
def test_meta_fields_of_the_wrong_type_are_refused_naming_the_field(
    tmp_path: Path, field: str, value: object, named: str
) -> None:
    builder = RunBuilder()
    builder.meta[field] = value
    path = builder.write(tmp_path / "run")
    with pytest.raises(RunDirError) as caught:
        load_run(path)
    assert f"meta.json: {named}: " in str(caught.value)


def test_meta_must_be_an_object_and_may_carry_fields_it_does_not_name(tmp_path: Path) -> None:
    path = RunBuilder().write(tmp_path / "run")
    (path / "meta.json").write_text("[1, 2]")
    with pytest.raises(RunDirError, match="must hold a JSON object, found list"):
        load_run(path)
    builder = RunBuilder()
    builder.meta |= {"status": "completed", "records": {"written": 3}, "windows": None}
    builder.meta["windows"] = {"stress": [1.0, 2.0], "after_load": None}
    assert load_run(builder.write(tmp_path / "ok")).meta["records"] == {"written": 3}
