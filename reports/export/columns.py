"""The requests table's columns an export needs, and no others, as one Arrow table.

A run of millions of requests has millions of rows of some thirty columns; an export reads
the few it writes (Parquet reads only those), keeps numbers as float64 and text as Arrow
strings (never Python objects), and checks each value's type as gates/rundir.py does: a
value of the wrong kind is refused, naming the file, row and column, never coerced.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gates import schema
from gates.rundir import DAMAGED, FIX, RunDirError, part_files, read_jsonl_table

NUMBER = pa.float64()
TEXT = pa.string()
NO_REQUESTS = "it has no requests (its requests table is empty or absent): was any load sent?"


class NothingToExport(Exception):
    """The run has no request the format can hold; the message says which and why."""


def request_files(run_dir: Path) -> list[Path]:
    """The files that hold the requests table, in the order rundir reads them: the compacted
    Parquet file, else the parts a long run set aside and then the live JSON lines."""
    compacted = run_dir / f"{schema.REQUESTS}.parquet"
    if compacted.is_file():
        return [compacted]
    files = [path for _, path in part_files(run_dir, schema.REQUESTS)]
    live = run_dir / f"{schema.REQUESTS}.jsonl"
    return [*files, live] if live.is_file() else files


def set_aside(run_dir: Path) -> list[str]:
    """Files of the requests table renamed as damaged: not read, so their rows are missing."""
    return sorted(p.name for p in run_dir.glob(f"{schema.REQUESTS}.*{DAMAGED}"))


def read_columns(run_dir: Path, columns: Sequence[str]) -> pa.Table:
    """`columns` of the requests table (each a column of contract.RequestRecord), over all
    its files; a column a file lacks (a run from before it existed) is null there."""
    unknown = [c for c in columns if c not in schema.REQUEST_COLUMNS]
    if unknown:
        raise ValueError(f"not columns of the requests table: {unknown}")
    kinds = pa.schema([(c, NUMBER if c in _NUMERIC else TEXT) for c in columns])
    pieces = [_read_file(path, kinds) for path in request_files(run_dir)]
    if not pieces:
        return kinds.empty_table()
    return pa.concat_tables(pieces)


_NUMERIC = schema.INT_COLUMNS | schema.FLOAT_COLUMNS


def _read_file(path: Path, kinds: pa.Schema) -> pa.Table:
    if path.suffix == ".parquet":
        table = _read_parquet(path, kinds)
    else:  # JSON lines: the run-directory reader checks every value of every row
        frame = read_jsonl_table(path, schema.REQUESTS).frame[kinds.names]
        table = pa.Table.from_pandas(frame, schema=kinds, preserve_index=False)
    _check_whole(table, path)
    return table


def _read_parquet(path: Path, kinds: pa.Schema) -> pa.Table:
    try:
        stored = pq.read_schema(path)
        present = [c for c in kinds.names if c in stored.names]
        table = pq.read_table(path, columns=present)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise RunDirError(
            f"{path} cannot be read ({exc}); `kvgate gate` on the run says how to go on"
        ) from exc
    arrays = []
    for field in kinds:
        if field.name in table.column_names:
            arrays.append(_typed(table.column(field.name), field, path))
        else:
            arrays.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=kinds)


def _typed(column: pa.ChunkedArray[Any], field: pa.Field[Any], path: Path) -> pa.ChunkedArray[Any]:
    """A stored column as its field's type: numbers from any integer or float type, text from
    strings (or numbers, read as their digits, as rundir reads them)."""
    kind = column.type
    fits_number = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    if field.type == NUMBER and (fits_number or pa.types.is_null(kind)):
        return column.cast(NUMBER)
    if field.type == TEXT and not pa.types.is_nested(kind) and not pa.types.is_binary(kind):
        return column.cast(TEXT)
    expects = "a number" if field.type == NUMBER else "text"
    raise RunDirError(
        f"{path}: table 'requests', column {field.name!r} expects {expects}, but the column is "
        f"stored as {kind}; {FIX}"
    )


def _check_whole(table: pa.Table, path: Path) -> None:
    """Integer columns hold whole numbers or nothing, as the run-directory reader demands."""
    for name in table.column_names:
        if name not in schema.INT_COLUMNS:
            continue
        values = table.column(name).to_numpy()
        bad = ~np.isnan(values) & ~(np.isfinite(values) & (np.floor(values) == values))
        if bad.any():
            i = int(np.argmax(bad))
            raise RunDirError(
                f"{path} row {i + 1}: table 'requests', column {name!r} expects a whole number, "
                f"found {values[i]!r}; {FIX}"
            )
