"""Reading run directories: Parquet first, JSON lines after, a crash's cut-off last line dropped."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gates.rundir import RunDirError, load_run
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
    (path / "faults.jsonl").write_text('{"fault_id": "f1", "t_start": "12.5"}\n')
    run = load_run(path)
    assert list(run.requests["request_id"]) == ["from-parquet"]
    assert run.sources["requests"] == "parquet" and run.sources["samples"] == "absent"
    assert run.faults["t_start"].iloc[0] == 12.5  # numeric columns are coerced
    assert "itl_p99_s" in run.requests.columns and run.samples.empty


def test_missing_meta_or_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="does not exist"):
        load_run(tmp_path / "nope")
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
