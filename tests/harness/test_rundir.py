"""Run-directory writers: one complete JSON object per line, compaction to Parquet."""

from __future__ import annotations

import json
from pathlib import Path

from gates import schema
from gates.rundir import load_run
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
    rundir.write_meta(tmp_path, {"t_start": 1.0, "t_end": 4.0})
    run = load_run(tmp_path)
    assert list(run.requests["request_id"]) == ["r0", "r1", "r2"]
    assert run.sources[schema.SAMPLES] == "parquet" and run.samples.empty
    assert rundir.read_table(tmp_path, schema.REQUESTS)["chunks"].tolist() == [0, 1, 2]
