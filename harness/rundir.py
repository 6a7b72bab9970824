"""The run directory (gates/schema.py): append-only JSON-lines writers, meta.json, compaction.

Each table has exactly one writer per process and one file per writer role, so two
processes never append to the same file: the Locust process owns requests and faults, the
sampler process owns samples and server_events. Every line is flushed as it is written, so
a crash loses at most the line being written. `compact` turns each table into Parquet at the
end; readers (gates/rundir.py, the one reader, which compaction uses too) fall back to the
JSON lines when a run died before that.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from contract.runmeta import RunMeta
from gates import schema
from gates.rundir import TEXT, RunDirError, part_files, read_jsonl_table, read_table, rows_frame

COLUMNS = schema.TABLE_COLUMNS
PART_ROWS = 200_000  # rows of a JSON-lines file before it is set aside as a Parquet part
log = logging.getLogger(__name__)


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf; store them as null so every reader agrees."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class TableWriter:
    """Appends rows of one table to `<table>.jsonl` and flushes each line.

    Every `part_rows` rows the file is set aside as the next part (`<table>.part-NNNNN.jsonl`,
    an atomic rename) and a child process turns it into Parquet, so a long run does not keep
    everything as JSON lines until the end; readers see the parts and the live file as one
    table (gates/rundir.py).

    Invariant: every line in the file is one complete JSON object holding exactly the
    table's columns (missing ones as null); writes from several threads never interleave.
    """

    def __init__(self, run_dir: Path, table: str, part_rows: int | None = PART_ROWS) -> None:
        self.run_dir = run_dir
        self.table = table
        self.columns = COLUMNS[table]
        self.path = run_dir / f"{table}.jsonl"
        self.part_rows = part_rows
        self._file: TextIO | None = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._in_file = 0
        self._converters: list[subprocess.Popen[bytes]] = []
        self.rows = 0

    def write(self, row: Mapping[str, Any]) -> None:
        line = json.dumps({c: _clean(row.get(c)) for c in self.columns}, default=str)
        with self._lock:
            if self._file is None:
                raise RuntimeError(f"{self.path} is closed; no more rows can be written")
            self._file.write(line + "\n")
            self._file.flush()
            self.rows += 1
            self._in_file += 1
            if self.part_rows and self._in_file >= self.part_rows:
                self._roll()

    def _roll(self) -> None:
        """Set the full file aside as the next part and start a new one (lock held)."""
        assert self._file is not None
        self._file.close()
        part = self.run_dir / f"{self.table}.part-{_next_part(self.run_dir, self.table):05d}.jsonl"
        os.replace(self.path, part)
        self._file = self.path.open("a", encoding="utf-8")
        self._in_file = 0
        self._converters = [c for c in self._converters if c.poll() is None]
        self._converters.append(
            subprocess.Popen(
                [sys.executable, "-m", "harness.rundir", "part", str(part), self.table],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def write_many(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.write(row)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
            for converter in self._converters:  # a part half-converted stays readable JSON
                converter.wait()
            self._converters = []


def _next_part(run_dir: Path, table: str) -> int:
    numbers = [n for n, _ in part_files(run_dir, table)]
    return max(numbers, default=0) + 1


def convert_part(part: Path, table: str) -> Path:
    """A JSON-lines part as Parquet beside it (atomic), then without its JSON lines."""
    frame = read_jsonl_table(part, table).frame
    target = part.with_suffix(".parquet")
    tmp = part.with_name(f".{target.name}.tmp")
    _storage(frame, table).to_parquet(tmp, index=False)
    os.replace(tmp, target)
    part.unlink(missing_ok=True)
    return target


def compact(run_dir: Path) -> dict[str, int]:
    """Turn every `<table>.jsonl` into `<table>.parquet` (atomically), then drop the JSON lines.

    The JSON lines are read by the gates' reader, so compaction refuses exactly what a reader
    would: a table it cannot read keeps its JSON lines (the error is logged, and `kvgate gate`
    names it again) instead of costing the run its meta.json. A torn last line is dropped.
    A table nobody wrote still gets an empty Parquet file, so readers see every table.
    Returns the row count of each table compacted.
    """
    counts: dict[str, int] = {}
    for table in schema.TABLES:
        jsonl = run_dir / f"{table}.jsonl"
        parts = [path for _, path in part_files(run_dir, table)]
        try:
            read = read_table(run_dir, table) if jsonl.exists() or parts else None
        except RunDirError as exc:
            log.error("%s stays as JSON lines: %s", table, exc)
            continue
        frame = read.frame if read is not None else rows_frame([], table, str)
        if read is not None and read.dropped:
            log.warning("%s: dropped a torn last line (the run was cut short)", jsonl)
        tmp = run_dir / f".{table}.parquet.tmp"
        _storage(frame, table).to_parquet(tmp, index=False)
        os.replace(tmp, run_dir / f"{table}.parquet")
        jsonl.unlink(missing_ok=True)
        for part in parts:
            part.unlink(missing_ok=True)
        counts[table] = len(frame)
    return counts


def _storage(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """Integer columns as nullable integers and text as text (the reader's categoricals
    too), so Parquet types never depend on the data or on how it was read."""
    out = frame.copy()
    for column in COLUMNS[table]:
        if column in schema.INT_COLUMNS:
            out[column] = out[column].astype("Int64")
        elif column in schema.CATEGORY_COLUMNS[table]:
            out[column] = out[column].astype(TEXT)
    return out


def write_meta(run_dir: Path, meta: RunMeta) -> Path:
    """Write meta.json atomically (a reader never sees half a file)."""
    path = run_dir / schema.META_FILE
    tmp = run_dir / f".{schema.META_FILE}.tmp"
    tmp.write_text(json.dumps(meta.dumped(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def main(argv: list[str]) -> int:
    """`python -m harness.rundir part PATH TABLE`: what a writer runs on each part it sets aside."""
    if len(argv) != 3 or argv[0] != "part":
        print("usage: python -m harness.rundir part PATH TABLE", file=sys.stderr)
        return 2
    convert_part(Path(argv[1]), argv[2])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
