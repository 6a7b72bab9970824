"""Request traces: the files a replay reads and an export writes, as one record type.

A trace is what production sent, without the text: when each request arrived, how long its
prompt and its answer were, and which blocks of its prompt it shared with earlier prompts.
Two public families are read:

- **Mooncake JSONL** (the format vLLM's benchmarks, GuideLLM, AIPerf, inference-perf and
  SGLang's bench_serving replay): one object a line, `timestamp` (ms from the trace's
  start), `input_length`, `output_length` and `hash_ids`, the ids of the prompt's blocks of
  `block_tokens` tokens each (512 in Mooncake's own traces); equal ids are identical blocks,
  so a prompt's prefix is shared exactly as far as its ids are.
- **Azure's LLM inference trace CSV** (`TIMESTAMP,ContextTokens,GeneratedTokens`, wall-clock
  timestamps): no block ids, so no prefix structure.

Only the standard library is used: the workloads read traces, `kvgate export` writes them.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, TextIO

MOONCAKE_BLOCK_TOKENS: Final = 512  # Mooncake's traces hash prompts in blocks of 512 tokens
AZURE_COLUMNS: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceFormat(StrEnum):
    MOONCAKE = "mooncake"
    AZURE = "azure"


class TraceError(ValueError):
    """A trace that cannot be read: names the file, the line and what to change."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace. `t_s` is its arrival in seconds from the trace's first
    request; `hash_ids` its prompt's block ids in order (empty when the trace has none)."""

    t_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Trace:
    """A whole trace, requests in arrival order. `block_tokens` is the size of one
    `hash_ids` block (None: the trace has no blocks)."""

    requests: tuple[TraceRequest, ...]
    fmt: TraceFormat
    block_tokens: int | None
    source: str

    @property
    def duration_s(self) -> float:
        return self.requests[-1].t_s if self.requests else 0.0


def detect_format(path: Path) -> TraceFormat:
    """A trace's format from its name: `.jsonl` (or `.json`) Mooncake, `.csv` Azure."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return TraceFormat.MOONCAKE
    if suffix == ".csv":
        return TraceFormat.AZURE
    raise TraceError(
        f"{path}: cannot tell the trace's format from its name; name it *.jsonl (Mooncake) or "
        f"*.csv (Azure), or give the format ({', '.join(TraceFormat)})"
    )


def read_trace(
    path: str | Path, fmt: TraceFormat | str | None = None, block_tokens: int | None = None
) -> Trace:
    """Read a whole trace. `block_tokens` defaults to Mooncake's 512 for a Mooncake trace;
    every request's `hash_ids` must cover its input at that size (a trace hashed in blocks
    of another size is refused with the size its lengths imply)."""
    p = Path(path)
    kind = TraceFormat(fmt) if fmt is not None else detect_format(p)
    if block_tokens is not None and block_tokens < 1:
        raise TraceError(f"{p}: block_tokens must be at least 1, not {block_tokens}")
    try:
        with p.open(encoding="utf-8", newline="") as f:
            if kind is TraceFormat.MOONCAKE:
                size = block_tokens or MOONCAKE_BLOCK_TOKENS
                requests = tuple(_read_mooncake(f, p, size))
            else:
                size = None
                requests = tuple(_read_azure(f, p))
    except OSError as exc:
        raise TraceError(f"cannot read trace {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{p}: not UTF-8 text ({exc.reason}); is it a trace?") from None
    if not requests:
        raise TraceError(f"{p}: the trace has no requests")
    return Trace(requests=requests, fmt=kind, block_tokens=size, source=str(p))


def _read_mooncake(f: TextIO, path: Path, block_tokens: int) -> Iterator[TraceRequest]:
    t0: float | None = None
    last = -math.inf
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not a JSON object ({exc.msg})") from None
        if not isinstance(row, dict):
            raise TraceError(f"{where}: a Mooncake line is a JSON object, not {line.strip()[:40]}")
        ts = _number(row, "timestamp", where)
        if ts < last:
            raise TraceError(
                f"{where}: timestamp {ts:g} is earlier than the line before ({last:g}); "
                "a trace lists requests in arrival order: sort it by timestamp"
            )
        last = ts
        t0 = ts if t0 is None else t0
        input_tokens = _count(row, "input_length", where, minimum=1)
        output_tokens = _count(row, "output_length", where, minimum=0)
        hash_ids = _hash_ids(row.get("hash_ids", []), where)
        if hash_ids:
            needed = math.ceil(input_tokens / block_tokens)
            if len(hash_ids) != needed:
                implied = math.ceil(input_tokens / len(hash_ids))
                raise TraceError(
                    f"{where}: {len(hash_ids)} hash_ids for {input_tokens} input tokens, but "
                    f"blocks of {block_tokens} tokens need {needed}; the trace's blocks look "
                    f"like about {implied} tokens each: give its block_tokens"
                )
        yield TraceRequest((ts - t0) / 1000.0, input_tokens, output_tokens, hash_ids)


def _read_azure(f: TextIO, path: Path) -> Iterator[TraceRequest]:
    reader = csv.DictReader(f)
    missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise TraceError(
            f"{path}: an Azure trace has the columns {', '.join(AZURE_COLUMNS)}; "
            f"missing {', '.join(missing)} (found {', '.join(reader.fieldnames or ()) or 'none'})"
        )
    t0: datetime | None = None
    last: datetime | None = None
    for row in reader:
        where = f"{path}:{reader.line_num}"
        when = _azure_time(row["TIMESTAMP"], where)
        if last is not None and when < last:
            raise TraceError(
                f"{where}: {row['TIMESTAMP']} is earlier than the line before; sort the trace "
                "by TIMESTAMP"
            )
        last = when
        t0 = when if t0 is None else t0
        yield TraceRequest(
            (when - t0).total_seconds(),
            _count(row, "ContextTokens", where, minimum=1),
            _count(row, "GeneratedTokens", where, minimum=0),
        )


def _azure_time(text: str, where: str) -> datetime:
    """Azure's timestamps carry 7 fractional digits, one more than datetime parses."""
    head, dot, frac = text.strip().partition(".")
    try:
        return datetime.fromisoformat(f"{head}.{frac[:6].ljust(6, '0')}" if dot else head)
    except ValueError:
        raise TraceError(
            f"{where}: TIMESTAMP {text!r} is not a time like 2023-11-16 18:15:46.6805900"
        ) from None


def _number(row: dict[str, Any], key: str, where: str) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceError(f"{where}: `{key}` must be a number (ms), not {value!r}")
    return float(value)


def _count(row: dict[str, Any], key: str, where: str, minimum: int) -> int:
    value = row.get(key)
    if isinstance(value, str):
        value = int(value) if value.strip().isdigit() else value
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(f"{where}: `{key}` must be a whole number >= {minimum}, not {value!r}")
    return value


def _hash_ids(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in value
    ):
        raise TraceError(f"{where}: `hash_ids` must be a list of whole numbers >= 0")
    return tuple(value)


def write_mooncake(requests: Iterable[TraceRequest], out: TextIO) -> int:
    """Write requests as Mooncake JSONL (timestamps in whole ms, as Mooncake's own traces
    write them); returns how many lines were written."""
    n = 0
    for r in requests:
        row = {
            "timestamp": round(r.t_s * 1000.0),
            "input_length": r.input_tokens,
            "output_length": r.output_tokens,
            "hash_ids": list(r.hash_ids),
        }
        out.write(json.dumps(row, separators=(", ", ": ")) + "\n")
        n += 1
    return n
