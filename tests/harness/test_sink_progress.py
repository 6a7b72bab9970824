"""The record sink (one row per request id) and the live console's sources of numbers."""

from __future__ import annotations

import json
from pathlib import Path

from gates import schema
from gates.rundir import read_jsonl
from harness.live.console import PoolTail
from harness.rundir import TableWriter
from harness.sink import RecordSink


def test_sink_writes_each_request_once_and_counts_outcomes(tmp_path: Path) -> None:
    sink = RecordSink(TableWriter(tmp_path, schema.REQUESTS))
    rows: list[dict[str, object]] = [
        {"request_id": "a", "outcome": "ok", "ttft_s": 0.2, "worker": "w1"},
        {"request_id": "b", "outcome": "cancelled", "ttft_s": None, "worker": "w1"},
        {"request_id": "c", "outcome": "rejected", "ttft_s": None, "worker": "w2"},
        {"request_id": "d", "outcome": "timeout", "ttft_s": None, "worker": "w2"},
        {"request_id": "a", "outcome": "ok", "ttft_s": 0.2, "worker": "w1"},
    ]
    written = [sink.add(row) for row in rows]
    assert written == [True, True, True, True, False]
    assert sink.total == 4 and sink.duplicates == 1
    assert [r["request_id"] for r in read_jsonl(tmp_path / "requests.jsonl").rows] == [
        "a",
        "b",
        "c",
        "d",
    ]
    assert sink.rejections == 1 and sink.errors == 1 and sink.recent_cancels(2.0) == 1
    assert sink.ttft_p95() == 0.2 and dict(sink.by_worker) == {"w1": 2, "w2": 2}


def test_pool_tail_keeps_the_newest_ratio_and_waits_for_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    row = {"t": 1, "source": "prometheus", "metric": "kvgate_pool_usage_ratio", "labels": ""}
    with path.open("w") as f:
        f.write(json.dumps({**row, "target": "r0", "value": 0.3}) + "\n")
        f.write(json.dumps({**row, "target": "r1", "value": 0.6}) + "\n")
        f.write(json.dumps({**row, "target": "r1", "value": 0.9})[:20])  # being written
    tail = PoolTail(path)
    assert tail.update() == 0.6
    with path.open("a") as f:
        f.write(json.dumps({**row, "target": "r1", "value": 0.9})[20:] + "\n")
    assert tail.update() == 0.9
