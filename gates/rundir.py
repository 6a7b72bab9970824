"""The one reader of a run directory (gates/schema.py): typed pandas tables and a checked meta.json.

Gates, reports and the harness's compaction all read through `read_table` and `load_run`.
Parquet comes first, JSON lines after. Every value is checked against its column's type
(schema.INT_COLUMNS, schema.FLOAT_COLUMNS, text otherwise) and a value of the wrong kind is
refused with a RunDirError naming the file, table, column and first offending row: never
coerced, because a run judged on the rows that survived a coercion could pass on a lie.
Null is allowed everywhere and means missing. A crash can cut the last line of a JSON-lines
file short; that line is dropped and counted, any other unreadable line is an error.

Numbers are float64 (NaN missing). Text with few values (schema.CATEGORY_COLUMNS) is a
categorical with sorted categories, other text pandas' text dtype; `load_run` then codes
the request ids of requests and server_events over one dictionary (gates/keys.py) and gives
the categorical columns the two tables share one dtype. A table of millions of rows is
compared, selected and joined as integers that way, and holds each text once.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from contract import FaultEffect
from contract.servers import ServerProfile
from gates import run_profile, schema
from gates.keys import one_dictionary
from gates.legacy import fill_fault_effects
from gates.memory import keep_freed_memory
from gates.meta import meta_problems

COLUMNS = schema.TABLE_COLUMNS
NUMERIC = schema.INT_COLUMNS | schema.FLOAT_COLUMNS
CATEGORIES = schema.CATEGORY_COLUMNS
# Missing text is NaN, like missing numbers: nullable Int64 and pd.NA strings would make
# boolean masks ambiguous further on.
TEXT = pd.StringDtype(na_value=np.nan)
FIX = "fix what wrote the run (null marks a missing value) or re-run; kvgate never guesses a value"


class RunDirError(Exception):
    """The run directory cannot be read; the message says what is wrong and what to do."""


@dataclass(frozen=True, slots=True)
class JsonLines:
    """The objects of a JSON-lines file, the line each came from, and the torn lines dropped."""

    rows: list[dict[str, Any]]
    line_numbers: list[int]
    dropped: int


@dataclass(frozen=True, slots=True)
class Table:
    """One table as read: exactly typed columns, where it came from, lines dropped."""

    frame: pd.DataFrame
    source: str  # "parquet", "jsonl", "parts" (a long run before compaction) or "absent"
    dropped: int = 0
    parts: tuple[int, ...] = ()  # the numbers of the parts read, when source is "parts"
    set_aside: tuple[str, ...] = ()  # its files renamed to `*.damaged` (_unreadable_fix)


@dataclass(slots=True)
class RunData:
    """One run's tables and meta. Every table has at least the schema's columns."""

    path: Path
    meta: dict[str, Any]  # meta.json as read, checked against contract.runmeta.RunMeta
    requests: pd.DataFrame
    server_events: pd.DataFrame
    samples: pd.DataFrame
    faults: pd.DataFrame
    # The server profile the run is judged by (gates/run_profile.py): the snapshot meta.json
    # keeps, else a profile file as it is today; where it came from, and why it is not the
    # run's own snapshot (None when it is).
    profile: ServerProfile
    profile_source: str
    profile_note: str | None
    # table name -> where it came from ("parquet", "jsonl", "absent") and dropped lines.
    sources: dict[str, str] = field(default_factory=dict)
    truncated_lines: dict[str, int] = field(default_factory=dict)
    # Each table's rows as read, before an evidence check dropped any, and the numbers of the
    # parts it was read from, and its files set aside as damaged: what the completeness
    # check holds against meta.json's counts.
    rows_read: dict[str, int] = field(default_factory=dict)
    parts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    set_aside: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Derived results keyed by what computed them (metrics shared by gates and reports).
    cache: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    # What the evidence checks found (a gates.evidence.EvidenceReport once they have run:
    # gates.evidence.check_evidence, which the evaluator calls before any gate).
    evidence: Any = None

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


def load_run(run_dir: Path | str, current_profiles: bool = False) -> RunData:
    """Read meta.json and the four tables of `run_dir`. The run is judged by the profile
    snapshot its meta.json keeps; `current_profiles` asks for today's profile files."""
    path = Path(run_dir)
    if not path.exists():
        raise RunDirError(
            f"run directory {path} does not exist; pass the directory `kvgate run` made"
        )
    if not path.is_dir():
        raise RunDirError(
            f"{path} is a file, not a run directory; pass the directory `kvgate run` made"
        )
    meta = read_meta(path)
    keep_freed_memory()  # a run's tables are large, and judging them makes and drops more
    try:
        judged_by = run_profile.resolve(meta, current=current_profiles)
    except run_profile.ProfileSnapshotError as exc:
        raise RunDirError(f"{path / schema.META_FILE}: {exc}") from exc
    tables = {name: read_table(path, name) for name in schema.TABLES}
    share_dictionaries(tables[schema.REQUESTS].frame, tables[schema.SERVER_EVENTS].frame)
    return RunData(
        path=path,
        meta=meta,
        requests=tables[schema.REQUESTS].frame,
        server_events=tables[schema.SERVER_EVENTS].frame,
        samples=tables[schema.SAMPLES].frame,
        faults=_fault_effects(tables[schema.FAULTS].frame, path),
        profile=judged_by.profile,
        profile_source=judged_by.source,
        profile_note=judged_by.note,
        sources={name: table.source for name, table in tables.items()},
        truncated_lines={name: t.dropped for name, t in tables.items() if t.dropped},
        rows_read={name: len(table.frame) for name, table in tables.items()},
        parts={name: table.parts for name, table in tables.items() if table.parts},
        set_aside={name: table.set_aside for name, table in tables.items() if table.set_aside},
    )


def share_dictionaries(requests: pd.DataFrame, events: pd.DataFrame) -> None:
    """Code both tables' request ids once, over one dictionary (gates/keys.py): the metrics
    join requests with their events on these integers, and each row holds a code instead
    of its own copy of the id. The columns both tables hold as categoricals (replica,
    tenant, priority) get one dtype too, so they compare and join by code as well."""
    requests["request_id"], events["request_id"] = one_dictionary(
        requests["request_id"], events["request_id"]
    )
    for column in sorted(CATEGORIES[schema.REQUESTS] & CATEGORIES[schema.SERVER_EVENTS]):
        requests[column], events[column] = _one_dtype(requests[column], events[column])


def _one_dtype(*columns: pd.Series) -> list[pd.Series]:
    """Categoricals of text (categorical_text) over the union of their categories, sorted,
    all of them of the very same dtype."""
    union = columns[0].cat.categories
    for column in columns[1:]:
        union = union.union(column.cat.categories)
    dtype = pd.CategoricalDtype(union.sort_values())
    return [
        pd.Series(
            pd.Categorical.from_codes(
                _recoded(column.cat.codes.to_numpy(), column.cat.categories, dtype.categories),
                dtype=dtype,
            ),
            index=column.index,
            name=column.name,
        )
        for column in columns
    ]


def _recoded(codes: np.ndarray, old: pd.Index, new: pd.Index) -> np.ndarray:
    """Codes over categories `old` as codes over `new`, which hold every one of them."""
    mapping = np.append(new.get_indexer(old), -1)  # the last: missing stays missing
    recoded: np.ndarray = mapping[np.where(codes < 0, len(old), codes)]
    return recoded


def _fault_effects(faults: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """The faults table with each row's `effect` (contract.FaultEffect), the one column the
    gates read to know what a fault did; rows written before it existed get theirs from
    gates/legacy.py."""
    faults = fill_fault_effects(faults)
    unknown = ~faults["effect"].isin([str(e) for e in FaultEffect])
    if unknown.any():
        i = int(np.argmax(unknown.to_numpy()))
        raise RunDirError(
            f"{run_dir}: table 'faults', row {i + 1}: effect {faults['effect'].iloc[i]!r} is "
            f"not one of {', '.join(FaultEffect)}; {FIX}"
        )
    return faults


def read_meta(run_dir: Path) -> dict[str, Any]:
    """meta.json of `run_dir`: refused unless UTF-8 JSON whose fields have the types
    contract.runmeta.RunMeta gives them (fields it does not name are kept as they are)."""
    path = run_dir / schema.META_FILE
    if not path.is_file():
        raise RunDirError(f"{path} is missing; is {run_dir} a kvgate run directory?")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunDirError(
            f"{path} is not UTF-8 (byte {exc.start}: {exc.reason}); "
            "it was damaged after the run wrote it: restore it or re-run"
        ) from exc
    except OSError as exc:
        raise RunDirError(f"{path} cannot be read ({exc.strerror or exc})") from exc
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path} is not valid JSON ({exc}); the run did not finish") from exc
    if not isinstance(meta, dict):
        raise RunDirError(
            f"{path} must hold a JSON object, found {type(meta).__name__}; "
            "it is not the meta.json `kvgate run` writes"
        )
    problems = meta_problems(meta)
    if problems:
        raise RunDirError(f"{path}: {'; '.join(problems)}; {FIX}")
    return meta


def read_table(run_dir: Path, name: str) -> Table:
    """Table `name` of `run_dir`: `<name>.parquet` when compacted; else the parts a long run
    set aside (`<name>.part-NNNNN.parquet`, or its JSON lines while it is being converted)
    in order, then `<name>.jsonl`. Files renamed to `*.damaged` are not read, only named."""
    table = _read_files(run_dir, name)
    aside = tuple(sorted(p.name for p in run_dir.glob(f"{name}.*{DAMAGED}")))
    return replace(table, set_aside=aside) if aside else table


def _read_files(run_dir: Path, name: str) -> Table:
    parquet = run_dir / f"{name}.parquet"
    if parquet.is_file():
        return Table(_read_parquet(parquet, name), "parquet")
    jsonl = run_dir / f"{name}.jsonl"
    numbered = part_files(run_dir, name)
    parts = [path for _, path in numbered]
    if not parts:
        if jsonl.is_file():
            return read_jsonl_table(jsonl, name)
        return Table(rows_frame([], name, str), "absent")
    pieces = [
        Table(_read_parquet(p, name), "parquet")
        if p.suffix == ".parquet"
        else read_jsonl_table(p, name)
        for p in parts
    ]
    if jsonl.is_file():
        pieces.append(read_jsonl_table(jsonl, name))
    frame = pd.concat([t.frame for t in pieces], ignore_index=True)
    for column in CATEGORIES[name]:  # parts with other categories concatenate as text
        frame[column] = categorical_text(frame[column])
    return Table(frame, "parts", sum(t.dropped for t in pieces), tuple(n for n, _ in numbered))


PART_NAME = re.compile(r"^(?P<table>[a-z_]+)\.part-(?P<n>\d+)\.(?P<kind>parquet|jsonl)$")
# A file renamed with this suffix is set aside: never read, but named by the completeness
# check (gates/evidence), so the rows it holds are missing out loud, not silently.
DAMAGED = ".damaged"


def part_files(run_dir: Path, name: str) -> list[tuple[int, Path]]:
    """(number, path) of each part of table `name`, in order; a part both converted and not
    yet removed as JSON lines counts once, as its Parquet file."""
    found: dict[int, Path] = {}
    for path in run_dir.glob(f"{name}.part-*"):
        match = PART_NAME.match(path.name)
        if match is None or match["table"] != name:
            continue
        n = int(match["n"])
        if match["kind"] == "parquet" or n not in found:
            found[n] = path
    return sorted(found.items())


def read_jsonl_table(path: Path, name: str) -> Table:
    """Table `name` from the JSON-lines file at `path` (compaction reads it this way too)."""
    lines = read_jsonl(path)
    numbers = lines.line_numbers
    frame = rows_frame(lines.rows, name, lambda i: f"{path}:{numbers[i]}")
    return Table(frame, "jsonl", lines.dropped)


def read_jsonl(path: Path) -> JsonLines:
    """The JSON objects of a JSON-lines file; only a torn last line is forgiven (and counted)."""
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise RunDirError(f"{path} cannot be read ({exc.strerror or exc})") from exc
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows: list[dict[str, Any]] = []
    numbers: list[int] = []
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if index == last:
                return JsonLines(rows, numbers, 1)  # a crash cut the last line short: drop it
            raise RunDirError(
                f"{path}:{index + 1} is not a line of UTF-8 JSON ({exc}); "
                "only the last line of a crashed run may be cut short: repair or remove this one"
            ) from exc
        if not isinstance(row, dict):
            raise RunDirError(
                f"{path}:{index + 1} holds {_describe(row)}, not a JSON object (one row per line)"
            )
        rows.append(row)
        numbers.append(index + 1)
    return JsonLines(rows, numbers, 0)


def rows_frame(rows: list[dict[str, Any]], name: str, where: Callable[[int], str]) -> pd.DataFrame:
    """Rows of table `name` as a typed frame; `where(i)` names row i in an error message.

    Columns the schema does not name are kept as they came; absent schema columns are null.
    """
    columns: dict[str, Any] = {}
    for column in COLUMNS[name]:
        values = [row.get(column) for row in rows]
        bad = _first_bad(values, column)
        if bad is not None:
            raise RunDirError(_refusal(where(bad), name, column, values[bad]))
        if column in NUMERIC:
            columns[column] = pd.Series(values, dtype=np.float64)
        else:
            text = [v if v is None or isinstance(v, str) else json.dumps(v) for v in values]
            columns[column] = pd.Series(text, dtype=TEXT)
            if column in CATEGORIES[name]:
                columns[column] = categorical_text(columns[column])
    extra = {key: None for row in rows for key in row if key not in columns}
    for column in extra:
        columns[column] = pd.Series([row.get(column) for row in rows]).infer_objects()
    frame = pd.DataFrame(columns, index=pd.RangeIndex(len(rows)))
    _check_whole(frame, name, where, frozenset())
    return frame


_NUMBER_TYPES = frozenset({int, float, type(None)})
_TEXT_TYPES = frozenset({str, int, float, bool, type(None)})


def _first_bad(values: list[Any], column: str) -> int | None:
    """Index of the first value of the wrong kind for `column`, or None."""
    allowed = _NUMBER_TYPES if column in NUMERIC else _TEXT_TYPES
    if set(map(type, values)) <= allowed:  # the common case, at C speed
        return None
    return next(i for i, v in enumerate(values) if type(v) not in allowed)


def _check_whole(
    frame: pd.DataFrame, name: str, where: Callable[[int], str], stored_whole: frozenset[str]
) -> None:
    """Integer columns hold whole numbers (or nothing): 3.5 chunks or an infinite pid is a bug.
    Columns in `stored_whole` were stored as integers, which nothing else can be."""
    for column in COLUMNS[name]:
        if column not in schema.INT_COLUMNS or column in stored_whole:
            continue
        values = frame[column].to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~np.isnan(values) & ~(np.isfinite(values) & (np.floor(values) == values))
        if bad.any():
            i = int(np.argmax(bad))
            raise RunDirError(
                f"{where(i)}: table {name!r}, column {column!r} expects a whole number, "
                f"found {values[i]!r}; {FIX}"
            )


def _read_parquet(path: Path, name: str) -> pd.DataFrame:
    try:
        # Parquet keeps text as a dictionary and its codes: read that way, the categorical
        # columns never hold one string per row.
        arrow = pq.read_table(path, read_dictionary=sorted(CATEGORIES[name]))
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise RunDirError(f"{path} cannot be read ({exc}); {_unreadable_fix(path, name)}") from exc
    expected = COLUMNS[name]
    for column in arrow.column_names:
        if column not in expected:
            continue
        kind = arrow.schema.field(column).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if column in NUMERIC:
            fits = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind)
        else:
            fits = not pa.types.is_nested(kind)
        if not fits:
            values = arrow.column(column).to_pylist()
            i = next((i for i, v in enumerate(values) if v is not None), 0)
            raise RunDirError(
                _refusal(f"{path} row {i + 1}", name, column, values[i] if values else None)
                + f" (the column is stored as {kind})"
            )
        if column not in NUMERIC and not pa.types.is_string(kind):
            # Text stored as numbers (a PID as target) reads as its digits, not as 1234.0.
            arrow = arrow.set_column(
                arrow.column_names.index(column), column, arrow.column(column).cast(pa.string())
            )
    # Column by column, each freed once converted: a table of tens of millions of rows is
    # never held twice over (in Arrow's memory and in pandas'). A float column without
    # nulls comes over as Arrow's own memory, which is read-only: it gets a copy, for a
    # reader may change a table it was given in place.
    borrowed = [
        c
        for c in arrow.column_names
        if pa.types.is_float64(arrow.schema.field(c).type) and arrow.column(c).null_count == 0
    ]
    integers = frozenset(
        c for c in arrow.column_names if pa.types.is_integer(arrow.schema.field(c).type)
    )
    frame = arrow.to_pandas(split_blocks=True, self_destruct=True)
    del arrow
    for column in borrowed:
        frame[column] = frame[column].to_numpy(copy=True)
    return _conform(frame, name, lambda i: f"{path} row {i + 1}", integers)


def _unreadable_fix(path: Path, name: str) -> str:
    """How to go on from an unreadable Parquet file without losing the rows it holds."""
    json_lines = path.with_suffix(".jsonl")
    if PART_NAME.match(path.name) and json_lines.is_file():
        return (
            f"its JSON lines are still beside it (the conversion was cut short): rename it to "
            f"{path.name}{DAMAGED} and the reader reads {json_lines.name} instead "
            f"(`python -m harness.rundir part {json_lines} {name}` converts them again)"
        )
    return (
        "do not delete it, its rows are nowhere else: restore it from a copy of the run if "
        f"there is one; else rename it to {path.name}{DAMAGED} to judge what is left, and the "
        "run reads INVALID, naming the file and the rows missing"
    )


def _conform(
    frame: pd.DataFrame,
    name: str,
    where: Callable[[int], str],
    stored_whole: frozenset[str] = frozenset(),
) -> pd.DataFrame:
    """Add absent schema columns (all missing) and give every column one dtype per kind;
    `stored_whole`: the columns the file stores as integers (_check_whole)."""
    frame = frame.reset_index(drop=True)
    for column in COLUMNS[name]:
        if column not in frame.columns:
            frame[column] = pd.Series(np.nan if column in NUMERIC else None, index=frame.index)
        if column in NUMERIC:
            frame[column] = frame[column].astype(np.float64)
        elif column in CATEGORIES[name]:
            frame[column] = categorical_text(frame[column])
        elif frame[column].dtype != TEXT:
            frame[column] = frame[column].astype(TEXT)
    _check_whole(frame, name, where, stored_whole)
    return frame


def categorical_text(values: pd.Series) -> pd.Series:
    """`values` (text, or a categorical of text) as a categorical whose categories are text
    in sorted order: sorting or grouping by it orders the values as their text would, and
    two columns read alike have equal dtypes. Missing stays missing (code -1)."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        categories = values.cat.categories
        if categories.dtype != TEXT:
            values = values.cat.rename_categories(categories.astype(TEXT))
    else:
        values = values.astype(TEXT).astype("category")
    categories = values.cat.categories
    ordered = categories.sort_values()
    if not categories.equals(ordered):
        values = values.cat.reorder_categories(ordered)
    return values


def _refusal(where: str, table: str, column: str, value: Any) -> str:
    expects = (
        "a whole number"
        if column in schema.INT_COLUMNS
        else "a number"
        if column in NUMERIC
        else "text"
    )
    return (
        f"{where}: table {table!r}, column {column!r} expects {expects}, "
        f"found {_describe(value)}; {FIX}"
    )


def _describe(value: Any) -> str:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    if isinstance(value, bool):
        return f"the boolean {json.dumps(value)}"
    if isinstance(value, str):
        return f"the text {shown}"
    if isinstance(value, list):
        return f"a list {shown}"
    if isinstance(value, dict):
        return f"an object {shown}"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return f"{type(value).__name__} {shown}"


def unwritable(exc: OSError) -> str:
    """What to tell a person when an output file could not be written."""
    target = exc.filename or "an output file"
    return (
        f"could not write {target}: {exc.strerror or exc}; "
        "make its directory writable (or free space) and run the command again"
    )
