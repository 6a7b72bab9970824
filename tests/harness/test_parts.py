"""A long run's tables in parts: set aside as they grow, read back as the same table."""

from __future__ import annotations

from pathlib import Path

from gates import schema
from gates.rundir import part_files, read_table
from harness.rundir import TableWriter, compact
from tests.waiting import wait_until


def rows(n: int, start: int = 0) -> list[dict[str, object]]:
    return [
        {"t": 1000.0 + i, "source": "test", "target": "r0", "metric": "m", "labels": "", "value": i}
        for i in range(start, start + n)
    ]


def wait_converted(run_dir: Path, parts: int) -> None:
    def converted() -> bool:
        found = part_files(run_dir, schema.SAMPLES)
        return len(found) == parts and all(p.suffix == ".parquet" for _, p in found)

    wait_until(converted, timeout_s=60, what=f"{parts} parts converted to Parquet")


def test_parts_read_back_as_one_table_while_and_after_the_run(tmp_path: Path) -> None:
    writer = TableWriter(tmp_path, schema.SAMPLES, part_rows=100)
    writer.write_many(rows(250))
    found = part_files(tmp_path, schema.SAMPLES)
    assert [n for n, _ in found] == [1, 2]  # 200 rows set aside, 50 still in samples.jsonl
    live = read_table(tmp_path, schema.SAMPLES)  # read mid-conversion: no row lost or doubled
    assert list(live.frame["value"]) == list(range(250))
    wait_converted(tmp_path, 2)
    assert list(read_table(tmp_path, schema.SAMPLES).frame["value"]) == list(range(250))
    writer.write_many(rows(10, start=250))
    writer.close()
    counts = compact(tmp_path)
    assert counts[schema.SAMPLES] == 260 and not part_files(tmp_path, schema.SAMPLES)
    final = read_table(tmp_path, schema.SAMPLES)
    assert final.source == "parquet" and list(final.frame["value"]) == list(range(260))
