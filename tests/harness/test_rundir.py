"""Run-directory writers: one JSON object per line, compaction through the one reader."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract.runmeta import RunMeta
from gates import schema
from gates.rundir import RunDirError, load_run, read_table
from harness import rundir


def test_writer_writes_exactly_the_columns_and_flushes_each_line(tmp_path: Path) -> None:
    writer = rundir.TableWriter(tmp_path, schema.SAMPLES)
    writer.write({"t": 1.0, "source": "nvml", "metric": "m", "value": float("nan"), "extra": 1})
    # flushed: readable before close
    row = json.loads((tmp_path / "samples.jsonl").read_text())
    assert list(row) == list(schema.SAMPLE_COLUMNS)
    assert row["value"] is None and row["target"] is None
    writer.close()


def test_compaction_keeps_rows_drops_a_torn_line_and_writes_every_table(tmp_path: Path) -> None:
    writer = rundir.TableWriter(tmp_path, schema.REQUESTS)
    for i in range(3):
        writer.write({"request_id": f"r{i}", "outcome": "ok", "t_send": 1.0 + i, "chunks": i})
    writer.close()
    with (tmp_path / "requests.jsonl").open("a") as f:
        f.write('{"request_id": "torn", "outc')  # a crash mid-line
    counts = rundir.compact(tmp_path)
    assert counts == {
        schema.REQUESTS: 3,
        schema.SERVER_EVENTS: 0,
        schema.SAMPLES: 0,
        schema.FAULTS: 0,
    }
    assert not (tmp_path / "requests.jsonl").exists()
    rundir.write_meta(tmp_path, RunMeta(t_start=1.0, t_end=4.0))
    run = load_run(tmp_path)
    assert list(run.requests["request_id"]) == ["r0", "r1", "r2"]
    assert run.sources[schema.SAMPLES] == "parquet" and run.samples.empty
    assert read_table(tmp_path, schema.REQUESTS).frame["chunks"].tolist() == [0, 1, 2]


def test_compaction_stores_integer_columns_as_integers(tmp_path: Path) -> None:
    writer = rundir.TableWriter(tmp_path, schema.REQUESTS)
    writer.write({"request_id": "a", "chunks": 3, "http_status": None, "t_send": 1.0})
    writer.close()
    rundir.compact(tmp_path)
    types = pq.read_schema(tmp_path / "requests.parquet")
    assert types.field("chunks").type == pa.int64()
    assert types.field("http_status").type == pa.int64()
    assert types.field("t_send").type == pa.float64()
    assert types.field("request_id").type in (pa.string(), pa.large_string())


def test_compaction_keeps_a_table_it_must_refuse_as_json_lines(tmp_path: Path) -> None:
    """The writer's reader is the gates' reader: what gates would refuse is not compacted
    into a Parquet file that hides it, and the other tables are still compacted."""
    writer = rundir.TableWriter(tmp_path, schema.REQUESTS)
    writer.write({"request_id": "a", "ttft_s": "fast"})
    writer.close()
    counts = rundir.compact(tmp_path)
    assert schema.REQUESTS not in counts and counts[schema.SAMPLES] == 0
    assert (tmp_path / "requests.jsonl").exists() and not (tmp_path / "requests.parquet").exists()
    rundir.write_meta(tmp_path, RunMeta(t_start=1.0, t_end=4.0))
    with pytest.raises(RunDirError, match=r"requests\.jsonl:1: table 'requests', column 'ttft_s'"):
        load_run(tmp_path)
