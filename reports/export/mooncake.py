"""A run's requests as a Mooncake trace: what the load generator sent, when, how long, and
which prompt blocks each request shared with earlier ones, so that the run can be replayed.

Which requests: every request of the requests table, in the order of its planned send time
(`t_scheduled`, an open-loop request's schedule) or else its send time (`t_send`), ties by
send time, then as recorded: a trace gives the requests of one instant no order (they
arrive together), so a replay's export keeps each instant's requests, not their order.
Cancelled, refused and failed requests are kept: they were sent, and a replay sends them
again. Left out, and counted: security probes (requests crafted to probe a server's
isolation, which a trace cannot express: it has no tenants), requests without a prompt (a
trace's `input_length` is at least 1), without a send time, and without an output length
(neither `max_tokens` nor the server's `completion_tokens`).

Each line: `timestamp`, ms from the first request's time (the schedule, not its jitter, for
a replayed request, so exporting a replay reproduces its trace); `input_length`, the prompt
tokens the workload aimed for; `output_length`, the `max_tokens` asked, or where none was
asked (the server chose), the tokens the server generated; `hash_ids`, the request's
`prompt_blocks` renumbered 0, 1, 2, ... in order of first appearance (Mooncake's "remapped
hashes"), at meta.json's `prompt_block_tokens`. A request whose blocks are missing, or do
not cover its input at that size, gets ids of its own, shared with nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contract.trace import MOONCAKE_BLOCK_TOKENS, TraceRequest, write_mooncake
from reports.export.columns import NO_REQUESTS, NothingToExport, read_columns

COLUMNS: Final = (
    "t_send",
    "t_scheduled",
    "target_prompt_tokens",
    "max_tokens",
    "completion_tokens",
    "probe",
    "prompt_blocks",
)
PROGRESS_ROWS: Final = 100_000  # a progress line every this many requests written
_CHUNK_ROWS: Final = 65_536  # requests turned into Python objects at a time

# Why a request is left out of the trace.
PROBE = "security probes (a trace has no tenants to probe across)"
NO_PROMPT = "requests without a prompt (a trace's input_length is at least 1)"
NO_TIME = "requests without a send time"
NO_OUTPUT = "requests without an output length (no max_tokens asked, no completion_tokens)"


@dataclass(slots=True)
class MooncakeExport:
    """What an export wrote: lines, blocks, and the requests left out by reason."""

    requests: int  # rows of the requests table
    written: int = 0
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    blocks: int = 0  # hash_ids written
    distinct_blocks: int = 0
    without_blocks: int = 0  # requests that recorded no blocks: ids of their own
    mismatched_blocks: int = 0  # recorded blocks that did not cover the input: ids of their own
    left_out: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class _Selected:
    """The requests to write, in trace order, as columns."""

    t_s: np.ndarray  # seconds from the first
    input_tokens: np.ndarray
    output_tokens: np.ndarray


def export_mooncake(
    run_dir: Path,
    block_tokens: int | None,
    out: TextIO,
    progress: Callable[[int, int], None] | None = None,
) -> MooncakeExport:
    """Write the run's requests to `out` as Mooncake JSONL. `block_tokens` is meta.json's
    `prompt_block_tokens` (None: no request recorded blocks). `progress(written, total)` is
    called every PROGRESS_ROWS lines. NothingToExport when no request can be written."""
    table = read_columns(run_dir, COLUMNS)
    size = block_tokens or MOONCAKE_BLOCK_TOKENS
    result = MooncakeExport(requests=table.num_rows, block_tokens=size)
    selected, blocks = _select(table, result)
    del table  # only the selected requests' columns are held from here on
    pa.default_memory_pool().release_unused()
    hash_ids, starts = _hash_ids(blocks, selected.input_tokens, result)
    del blocks  # the ids are numbers now
    total = len(selected.t_s)

    def lines() -> Iterator[TraceRequest]:
        for first in range(0, total, _CHUNK_ROWS):
            last = min(first + _CHUNK_ROWS, total)
            ids = hash_ids[starts[first] : starts[last]].tolist()
            offsets = (starts[first : last + 1] - starts[first]).tolist()
            rows = zip(
                selected.t_s[first:last].tolist(),
                selected.input_tokens[first:last].tolist(),
                selected.output_tokens[first:last].tolist(),
                strict=True,
            )
            for i, (t_s, input_tokens, output_tokens) in enumerate(rows):
                ids_i = tuple(ids[offsets[i] : offsets[i + 1]])
                yield TraceRequest(t_s, input_tokens, output_tokens, ids_i)
                result.written += 1
                if progress is not None and result.written % PROGRESS_ROWS == 0:
                    progress(result.written, total)

    write_mooncake(lines(), out)
    return result


def _select(table: pa.Table, result: MooncakeExport) -> tuple[_Selected, pa.Array[Any]]:
    """The requests a trace holds, in trace order, and their `prompt_blocks` (null where
    none); counts the others by reason."""
    probe = table.column("probe").is_valid().to_numpy(zero_copy_only=False)
    t_send = table.column("t_send").to_numpy()
    t_scheduled = table.column("t_scheduled").to_numpy()
    prompt = table.column("target_prompt_tokens").to_numpy()
    asked = table.column("max_tokens").to_numpy()
    output = np.where(np.isnan(asked), table.column("completion_tokens").to_numpy(), asked)
    t = np.where(np.isnan(t_scheduled), t_send, t_scheduled)
    reasons = [
        (PROBE, probe),
        (NO_PROMPT, ~(prompt >= 1)),
        (NO_TIME, np.isnan(t)),
        (NO_OUTPUT, ~(output >= 0)),
    ]
    kept = np.ones(table.num_rows, dtype=bool)
    for reason, out in reasons:
        dropped = int((kept & out).sum())
        if dropped:
            result.left_out[reason] = dropped
        kept &= ~out
    if not kept.any():
        raise NothingToExport(_nothing(table.num_rows, result.left_out))
    rows = np.flatnonzero(kept)
    # Trace order: the time, ties by the send, then as recorded (lexsort is stable).
    rows = rows[np.lexsort((t_send[rows], t[rows]))]
    selected = _Selected(
        t_s=t[rows] - t[rows[0]],
        input_tokens=prompt[rows].astype(np.int64),
        output_tokens=output[rows].astype(np.int64),
    )
    return selected, table.column("prompt_blocks").take(rows).combine_chunks()


def _nothing(requests: int, left_out: Counter[str]) -> str:
    if not requests:
        return NO_REQUESTS
    why = "; ".join(f"{n} {reason}" for reason, n in left_out.items())
    return f"none of its {requests} requests can go into a trace: {why}"


def _hash_ids(
    blocks: pa.Array[Any], input_tokens: np.ndarray, result: MooncakeExport
) -> tuple[np.ndarray, np.ndarray]:
    """Every request's hash_ids, concatenated in trace order, and where each request's
    start (`starts[i]:starts[i + 1]`). Ids are numbered in order of first appearance."""
    expected = -(-input_tokens // result.block_tokens)  # ceil: the blocks its input fills
    lists = pc.split_pattern(blocks, pattern=" ")
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)  # NaN: no blocks
    found = np.nan_to_num(lengths.astype(np.float64), nan=-1.0).astype(np.int64)
    recorded = found == expected
    result.without_blocks = int((found < 0).sum())
    result.mismatched_blocks = int(((found >= 0) & ~recorded).sum())
    # Arrow numbers a dictionary's values in order of first appearance: the trace order.
    flat = pc.list_flatten(lists.filter(pa.array(recorded)))
    # 32-bit numbers where they fit: a long run holds tens of millions of blocks
    kind = np.int32 if expected.sum() < np.iinfo(np.int32).max else np.int64
    codes = flat.dictionary_encode().indices.to_numpy().astype(kind)
    del lists, flat  # the ids' text is no longer needed
    pa.default_memory_pool().release_unused()
    own = np.repeat(~recorded, expected)  # blocks of requests that get ids of their own
    # A block is new where it is first seen: every block of its own, and a recorded one whose
    # code passes every code before it (codes count up by first appearance). Counting the
    # new blocks numbers both kinds together in order of appearance.
    before = np.maximum.accumulate(codes) if len(codes) else codes
    first = codes > np.concatenate((np.array([-1], dtype=kind), before[:-1]))
    new = own.copy()
    new[~own] = first
    ids = np.cumsum(new, dtype=kind) - 1
    ids[~own] = ids[~own][first][codes]  # a recorded block repeats the id it first got
    result.blocks, result.distinct_blocks = len(ids), int(new.sum())
    return ids, np.concatenate(([0], np.cumsum(expected)))
