"""The run directory (DESIGN.md section 6): append-only JSON-lines writers, meta.json, compaction.

Each table has exactly one writer per process and one file per writer role, so two
processes never append to the same file: the Locust process owns requests and faults, the
sampler process owns samples and server_events. Every line is flushed as it is written, so
a crash loses at most the line being written. `compact` turns each table into Parquet at the
end; readers fall back to the JSON lines when a run died before that.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from gates import schema

COLUMNS = schema.TABLE_COLUMNS


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf; store them as null so every reader agrees."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class TableWriter:
    """Appends rows of one table to `<table>.jsonl` and flushes each line.

    Invariant: every line in the file is one complete JSON object holding exactly the
    table's columns (missing ones as null); writes from several threads never interleave.
    """

    def __init__(self, run_dir: Path, table: str) -> None:
        self.table = table
        self.columns = COLUMNS[table]
        self.path = run_dir / f"{table}.jsonl"
        self._file: TextIO | None = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self.rows = 0

    def write(self, row: Mapping[str, Any]) -> None:
        line = json.dumps({c: _clean(row.get(c)) for c in self.columns}, default=str)
        with self._lock:
            if self._file is None:
                raise RuntimeError(f"{self.path} is closed; no more rows can be written")
            self._file.write(line + "\n")
            self._file.flush()
            self.rows += 1

    def write_many(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.write(row)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; a torn last line (crash mid-write) is skipped."""
    rows: list[dict[str, Any]] = []
    if not path.exists():
        return rows
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def table_frame(rows: list[dict[str, Any]], table: str) -> pd.DataFrame:
    """A DataFrame with exactly the table's columns and stable dtypes."""
    columns = COLUMNS[table]
    frame = pd.DataFrame(rows, columns=list(columns))
    for col in columns:
        if col in schema.INT_COLUMNS:
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
        elif col in schema.FLOAT_COLUMNS:
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
        else:
            frame[col] = frame[col].astype("string")
    return frame


def read_table(run_dir: Path, table: str) -> pd.DataFrame:
    """A table of a run directory: Parquet when compacted, else its JSON lines."""
    parquet = run_dir / f"{table}.parquet"
    if parquet.exists():
        return pd.read_parquet(parquet)
    return table_frame(read_jsonl(run_dir / f"{table}.jsonl"), table)


def compact(run_dir: Path) -> dict[str, int]:
    """Turn every `<table>.jsonl` into `<table>.parquet` (atomically), then drop the JSON lines.

    A table nobody wrote still gets an empty Parquet file, so readers see every table.
    Returns the row count per table.
    """
    counts: dict[str, int] = {}
    for table in schema.TABLES:
        jsonl = run_dir / f"{table}.jsonl"
        frame = table_frame(read_jsonl(jsonl), table)
        tmp = run_dir / f".{table}.parquet.tmp"
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, run_dir / f"{table}.parquet")
        jsonl.unlink(missing_ok=True)
        counts[table] = len(frame)
    return counts


def write_meta(run_dir: Path, meta: Mapping[str, Any]) -> Path:
    """Write meta.json atomically (a reader never sees half a file)."""
    path = run_dir / schema.META_FILE
    tmp = run_dir / f".{schema.META_FILE}.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_meta(run_dir: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((run_dir / schema.META_FILE).read_text())
    return meta
