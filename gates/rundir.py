"""Reading a run directory (gates/schema.py) into pandas tables, Parquet first, JSON lines after.

A run that crashed leaves JSON-lines files whose last line may be cut short; that line is
dropped (and counted), any other unreadable line is an error naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from gates import schema

COLUMNS = schema.TABLE_COLUMNS
# Columns that must be numeric whatever the source wrote (None -> NaN).
NUMERIC = schema.INT_COLUMNS | schema.FLOAT_COLUMNS
TEXT = pd.StringDtype(na_value=np.nan)


class RunDirError(Exception):
    """The run directory cannot be read; the message says what is wrong and what to do."""


@dataclass(slots=True)
class RunData:
    """One run's tables and meta. Every table has at least the schema's columns."""

    path: Path
    meta: dict[str, Any]
    requests: pd.DataFrame
    server_events: pd.DataFrame
    samples: pd.DataFrame
    faults: pd.DataFrame
    # table name -> where it came from ("parquet", "jsonl", "absent") and dropped lines.
    sources: dict[str, str] = field(default_factory=dict)
    truncated_lines: dict[str, int] = field(default_factory=dict)
    # Derived results keyed by what computed them (metrics shared by gates and reports).
    cache: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def table(self, name: str) -> pd.DataFrame:
        frame: pd.DataFrame = getattr(self, name)
        return frame

    @property
    def t_end(self) -> float:
        """End of the run: meta.t_end, else the latest timestamp seen anywhere."""
        value = self.meta.get("t_end")
        if isinstance(value, int | float):
            return float(value)
        latest = [
            self.requests["t_send"].max(),
            self.server_events["t"].max(),
            self.samples["t"].max(),
        ]
        found = [float(x) for x in latest if pd.notna(x)]
        return max(found) if found else 0.0

    @property
    def t_start(self) -> float:
        value = self.meta.get("t_start")
        if isinstance(value, int | float):
            return float(value)
        earliest = [
            self.requests["t_send"].min(),
            self.server_events["t"].min(),
            self.samples["t"].min(),
        ]
        found = [float(x) for x in earliest if pd.notna(x)]
        return min(found) if found else 0.0


def load_run(run_dir: Path | str) -> RunData:
    """Read meta.json and the four tables of `run_dir`."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RunDirError(
            f"run directory {path} does not exist; pass the directory `kvgate run` made"
        )
    meta_path = path / schema.META_FILE
    if not meta_path.is_file():
        raise RunDirError(f"{meta_path} is missing; is {path} a kvgate run directory?")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{meta_path} is not valid JSON ({exc}); the run did not finish") from exc
    if not isinstance(meta, dict):
        raise RunDirError(f"{meta_path} must hold a JSON object, found {type(meta).__name__}")
    tables: dict[str, pd.DataFrame] = {}
    sources: dict[str, str] = {}
    truncated: dict[str, int] = {}
    for name in schema.TABLES:
        frame, source, dropped = _read_table(path, name)
        tables[name] = _conform(frame, name)
        sources[name] = source
        if dropped:
            truncated[name] = dropped
    return RunData(
        path=path,
        meta=meta,
        requests=tables[schema.REQUESTS],
        server_events=tables[schema.SERVER_EVENTS],
        samples=tables[schema.SAMPLES],
        faults=tables[schema.FAULTS],
        sources=sources,
        truncated_lines=truncated,
    )


def _read_table(path: Path, name: str) -> tuple[pd.DataFrame, str, int]:
    parquet = path / f"{name}.parquet"
    if parquet.is_file():
        try:
            return pq.read_table(parquet).to_pandas(), "parquet", 0
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise RunDirError(
                f"{parquet} cannot be read ({exc}); delete it to fall back to JSON lines"
            ) from exc
    jsonl = path / f"{name}.jsonl"
    if jsonl.is_file():
        rows, dropped = _read_jsonl(jsonl)
        return pd.DataFrame.from_records(rows), "jsonl", dropped
    return pd.DataFrame(), "absent", 0


def _read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    lines = path.read_text(errors="replace").splitlines()
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                return rows, 1  # a crash cut the last line short: drop it
            raise RunDirError(f"{path}:{number} is not valid JSON ({exc})") from exc
    return rows, 0


def _conform(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """Add absent schema columns (all missing) and give every column one dtype per kind.

    Numeric columns become float64 (NaN for missing) and text columns the NaN-missing string
    dtype, whatever the writer used (nullable Int64 and pd.NA strings would make boolean
    masks ambiguous further on).
    """
    missing = [c for c in COLUMNS[name] if c not in frame.columns]
    if missing:
        extra = pd.DataFrame({c: pd.Series([None] * len(frame), dtype=object) for c in missing})
        extra.index = frame.index
        frame = pd.concat([frame, extra], axis=1)
    for column in COLUMNS[name]:
        if column in NUMERIC:
            if frame[column].dtype != np.float64:
                frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(np.float64)
        elif frame[column].dtype != TEXT:
            frame[column] = frame[column].astype(TEXT)
    return frame
