"""`kvgate export --format mooncake`: a run's requests as a trace that reads back with the
run's schedule, lengths and prefix structure; what it leaves out, counted."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from contract.trace import MOONCAKE_BLOCK_TOKENS, Trace, read_trace
from gates import schema
from reports.export import mooncake
from reports.export.columns import NothingToExport
from reports.export.mooncake import MooncakeExport, export_mooncake
from tests.gates.builder import T0, RunBuilder


def export(
    path: Path, block_tokens: int | None = MOONCAKE_BLOCK_TOKENS
) -> tuple[Trace, MooncakeExport]:
    out = io.StringIO()
    done = export_mooncake(path, block_tokens, out)
    trace_file = path / "exported.jsonl"
    trace_file.write_text(out.getvalue())
    return read_trace(trace_file, block_tokens=block_tokens), done


def mixed_run() -> RunBuilder:
    """Closed-loop requests (sent when sent) and replayed ones (sent late against their
    schedule), recorded in the order they ended, not the order they went out."""
    b = RunBuilder()
    b.request("late-end", t=12.0, target_prompt_tokens=700, max_tokens=20, e2e_s=9.0)
    b.request(
        "replayed-2",
        t=10.541,
        t_scheduled=T0 + 10.5,
        target_prompt_tokens=513,
        max_tokens=1,
        prompt_blocks="a1 b2",
    )
    b.request(
        "cancelled",
        t=11.25,
        outcome="cancelled",
        target_prompt_tokens=64,
        max_tokens=300,
        prompt_blocks="c3",
    )
    b.request(
        "replayed-1",
        t=10.003,
        t_scheduled=T0 + 10.0,
        target_prompt_tokens=1024,
        max_tokens=64,
        prompt_blocks="a1 d4",
    )
    b.request(
        "refused",
        t=13.0004,
        outcome="rejected",
        http_status=429,
        target_prompt_tokens=2000,
        max_tokens=5,
        prompt_blocks="a1 d4 e5 f6",
    )
    return b


def expected_schedule(records: Sequence[dict[str, Any]]) -> list[tuple[float, int, int]]:
    """The records' own schedule: each request's planned time (or its send), ms from the
    first, with the tokens it aimed for and the tokens it asked for."""
    rows = pd.DataFrame(records)
    rows = rows[rows["probe"].isna()]
    t = rows["t_scheduled"].fillna(rows["t_send"])
    rows = rows.assign(t=t).sort_values(["t", "t_send"], kind="stable")
    return [
        (round((t - rows["t"].min()) * 1000) / 1000, int(n), int(m))
        for t, n, m in zip(rows["t"], rows["target_prompt_tokens"], rows["max_tokens"], strict=True)
    ]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_the_trace_reads_back_with_the_runs_schedule_and_lengths(tmp_path: Path, fmt: str) -> None:
    b = mixed_run()
    trace, done = export(b.write(tmp_path / "run", fmt=fmt))
    got = [(r.t_s, r.input_tokens, r.output_tokens) for r in trace.requests]
    assert got == expected_schedule(b.rows[schema.REQUESTS])
    assert done.written == done.requests == 5 and not done.left_out


def test_a_replayed_request_is_written_at_its_schedule_not_when_it_went_out(
    tmp_path: Path,
) -> None:
    b = RunBuilder()
    for i, jitter in enumerate([0.004, 0.061, 0.0005]):
        planned = 20.0 + 0.25 * i
        b.request(f"r{i}", t=planned + jitter, t_scheduled=T0 + planned, max_tokens=8)
    trace, _ = export(b.write(tmp_path / "run"))
    assert [r.t_s for r in trace.requests] == [0.0, 0.25, 0.5]


def test_hash_ids_are_renumbered_in_order_of_first_appearance(tmp_path: Path) -> None:
    trace, done = export(mixed_run().write(tmp_path / "run"))
    # In trace order: replayed-1 (a1 d4), replayed-2 (a1 b2), cancelled (c3), late-end (no
    # blocks recorded: ids of its own), refused (a1 d4 e5 f6).
    assert [r.hash_ids for r in trace.requests] == [
        (0, 1),
        (0, 2),
        (3,),
        (4, 5),
        (0, 1, 6, 7),
    ]
    assert done.blocks == 11 and done.distinct_blocks == 8 and done.without_blocks == 1


def test_requests_that_share_a_prefix_share_its_ids_and_no_more(tmp_path: Path) -> None:
    b = RunBuilder()
    blocks = {"x": "p q r", "y": "p q s", "z": "t"}
    for i, (name, ids) in enumerate(blocks.items()):
        b.request(
            name,
            t=20.0 + i,
            target_prompt_tokens=3 * 512 if name != "z" else 5,
            max_tokens=1,
            prompt_blocks=ids,
        )
    trace, _ = export(b.write(tmp_path / "run"))
    x, y, z = (r.hash_ids for r in trace.requests)
    assert x[:2] == y[:2] and x[2] != y[2] and not set(z) & (set(x) | set(y))


def test_blocks_that_do_not_cover_their_input_get_ids_of_their_own(tmp_path: Path) -> None:
    b = RunBuilder()
    b.request("a", t=20.0, target_prompt_tokens=1024, max_tokens=1, prompt_blocks="k l")
    b.request("b", t=21.0, target_prompt_tokens=2000, max_tokens=1, prompt_blocks="k l")
    trace, done = export(b.write(tmp_path / "run"))
    assert done.mismatched_blocks == 1 and done.without_blocks == 0
    first, second = trace.requests
    assert first.hash_ids == (0, 1)
    assert len(second.hash_ids) == math.ceil(2000 / MOONCAKE_BLOCK_TOKENS)
    assert not set(second.hash_ids) & set(first.hash_ids)


def test_blocks_are_read_at_the_size_meta_json_records(tmp_path: Path) -> None:
    b = RunBuilder()
    b.request("a", t=20.0, target_prompt_tokens=40, max_tokens=1, prompt_blocks="m n o")
    b.request("b", t=21.0, target_prompt_tokens=33, max_tokens=1, prompt_blocks="m n p")
    trace, done = export(b.write(tmp_path / "run"), block_tokens=16)
    assert done.block_tokens == 16 and trace.block_tokens == 16
    assert [r.hash_ids for r in trace.requests] == [(0, 1, 2), (0, 1, 3)]


def test_probes_and_requests_a_trace_cannot_hold_are_left_out_and_counted(
    tmp_path: Path,
) -> None:
    b = RunBuilder()
    b.request("kept", t=20.0, max_tokens=10)
    b.request("server-chose", t=21.0, max_tokens=None, completion_tokens=12)
    b.request("probe", t=22.0, max_tokens=8, probe="escalation")
    b.request("group", t=22.5, max_tokens=8, probe="prefix_probe", probe_group="g")
    b.request("empty", t=23.0, max_tokens=8, target_prompt_tokens=0)
    b.request("unknown-output", t=24.0, max_tokens=None, completion_tokens=None)
    trace, done = export(b.write(tmp_path / "run"))
    assert [r.output_tokens for r in trace.requests] == [10, 12]
    assert done.written == 2 and done.requests == 6
    assert done.left_out == {mooncake.PROBE: 2, mooncake.NO_PROMPT: 1, mooncake.NO_OUTPUT: 1}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([], "has no requests"),
        ([{"probe": "escalation"}, {"probe": "prefix_warm"}], "none of its 2 requests"),
    ],
)
def test_a_run_with_nothing_a_trace_can_hold_is_refused(
    tmp_path: Path, rows: Sequence[dict[str, Any]], message: str
) -> None:
    b = RunBuilder()
    for i, fields in enumerate(rows):
        b.request(f"r{i}", max_tokens=8, **fields)
    with pytest.raises(NothingToExport, match=message):
        export_mooncake(b.write(tmp_path / "run"), None, io.StringIO())


def test_a_long_run_is_read_from_its_parts_and_its_live_lines(tmp_path: Path) -> None:
    """Before compaction a long run's table is parts and then JSON lines: all are read, and
    a part written before the newer columns existed has none of them."""
    b = mixed_run()
    path = b.write(tmp_path / "run")
    rows = b.rows[schema.REQUESTS]
    old = pd.DataFrame(rows[:2]).drop(columns=["t_scheduled", "prompt_blocks"])
    old.to_parquet(path / "requests.part-00000.parquet", index=False)
    (path / "requests.jsonl").write_text(
        "".join(pd.DataFrame(rows[2:]).to_json(orient="records", lines=True))
    )
    trace, done = export(path)
    # The old part's replayed request lost its schedule with its column: it counts its send.
    as_stored = [r | {"t_scheduled": None} for r in rows[:2]] + rows[2:]
    got = [(r.t_s, r.input_tokens, r.output_tokens) for r in trace.requests]
    assert got == expected_schedule(as_stored)
    assert done.written == 5 and done.without_blocks == 2


def test_progress_is_reported_as_lines_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mooncake, "PROGRESS_ROWS", 2)
    seen: list[tuple[int, int]] = []
    path = mixed_run().write(tmp_path / "run")
    export_mooncake(path, None, io.StringIO(), lambda done, total: seen.append((done, total)))
    assert seen == [(2, 5), (4, 5)]


SHIPPED = Path(__file__).resolve().parents[3] / "harness" / "plans" / "traces"


def test_the_export_of_a_replayed_trace_is_that_trace(tmp_path: Path) -> None:
    """A replay sends request i at its trace's time (a little late), with input_length tokens
    and max_tokens = output_length, and records the trace's hash_ids as its prompt blocks;
    the requests of one instant go out in trace order. Its records, stored in the order the
    requests ended, export as the trace itself: schedule, lengths and remapped hash_ids."""
    trace = read_trace(SHIPPED / "mooncake_conversation.jsonl")
    head = trace.requests[:400]
    rng = np.random.default_rng(0)
    b = RunBuilder()
    for i, r in enumerate(head):
        b.request(
            f"replay-{i}",
            t=10.0 + r.t_s + 0.002 + (i + rng.uniform(0, 1)) * 1e-5,  # late, in order
            t_scheduled=T0 + 10.0 + r.t_s,
            target_prompt_tokens=r.input_tokens,
            max_tokens=r.output_tokens,
            prompt_blocks=" ".join(map(str, r.hash_ids)),
            e2e_s=float(rng.uniform(0.1, 30.0)),
        )
    rows = b.rows[schema.REQUESTS]
    rows.sort(key=lambda row: row["t_send"] + row["e2e_s"])  # as they ended
    again, done = export(b.write(tmp_path / "run"))
    assert again.requests == head and done.written == len(head)
