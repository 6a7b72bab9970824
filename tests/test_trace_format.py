"""contract/trace.py: reading Mooncake and Azure traces, refusing malformed ones, writing
Mooncake back."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from contract.trace import (
    MOONCAKE_BLOCK_TOKENS,
    TraceError,
    TraceFormat,
    TraceRequest,
    read_trace,
    write_mooncake,
)

ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = ROOT / "harness" / "plans" / "traces" / "mooncake_conversation.jsonl"


def _jsonl(tmp_path: Path, rows: Sequence[object], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_shipped_mooncake_trace_reads_whole() -> None:
    trace = read_trace(MOONCAKE)
    assert trace.fmt is TraceFormat.MOONCAKE
    assert trace.block_tokens == MOONCAKE_BLOCK_TOKENS
    assert len(trace.requests) == 12031
    assert trace.requests[0].t_s == 0.0
    assert trace.duration_s == pytest.approx(3537.0, abs=1.0)
    first = trace.requests[0]
    assert (first.input_tokens, first.output_tokens) == (6758, 500)
    assert first.hash_ids == tuple(range(14))
    assert all(a.t_s <= b.t_s for a, b in zip(trace.requests, trace.requests[1:], strict=False))


def test_timestamps_are_seconds_from_the_first_request(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path,
        [
            {"timestamp": 5000, "input_length": 10, "output_length": 2, "hash_ids": [7]},
            {"timestamp": 6500, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]},
        ],
    )
    trace = read_trace(path)
    assert [r.t_s for r in trace.requests] == [0.0, 1.5]
    assert trace.requests[1].hash_ids == (7, 8)


def test_a_trace_hashed_in_other_blocks_is_refused_with_the_size_its_lengths_imply(
    tmp_path: Path,
) -> None:
    path = _jsonl(
        tmp_path,
        [{"timestamp": 0, "input_length": 64, "output_length": 1, "hash_ids": [1, 2, 3, 4]}],
    )
    with pytest.raises(TraceError, match=r"t.jsonl:1: 4 hash_ids .* about 16 tokens each"):
        read_trace(path)
    assert read_trace(path, block_tokens=16).requests[0].hash_ids == (1, 2, 3, 4)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"timestamp": "0", "input_length": 1, "output_length": 1}, "`timestamp` must be a number"),
        ({"timestamp": 0, "input_length": 0, "output_length": 1}, "`input_length` must be a whole"),
        ({"timestamp": 0, "input_length": 5, "output_length": -1}, "`output_length` must be"),
        ({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [-1]}, "hash_ids"),
        ([1, 2], "a Mooncake line is a JSON object"),
    ],
)
def test_malformed_lines_are_refused_by_file_and_line(
    tmp_path: Path, row: object, message: str
) -> None:
    ok = {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}
    path = _jsonl(tmp_path, [ok, row])
    with pytest.raises(TraceError, match=f"t.jsonl:2: .*{message}"):
        read_trace(path)


def test_requests_out_of_arrival_order_are_refused(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 10, "input_length": 5, "output_length": 1},
        {"timestamp": 3, "input_length": 5, "output_length": 1},
    ]
    with pytest.raises(TraceError, match="sort it by timestamp"):
        read_trace(_jsonl(tmp_path, rows))


def test_an_azure_trace_reads_with_its_seven_digit_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    trace = read_trace(path)
    assert trace.fmt is TraceFormat.AZURE and trace.block_tokens is None
    assert trace.requests == (
        TraceRequest(0.0, 374, 44),
        TraceRequest(pytest.approx(4.314579), 396, 109),  # type: ignore[arg-type]  # approx
    )


def test_an_azure_trace_without_its_columns_is_refused_naming_them(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text("time,in,out\n1,2,3\n")
    with pytest.raises(TraceError, match="missing TIMESTAMP, ContextTokens, GeneratedTokens"):
        read_trace(path)


def test_unknown_names_empty_files_and_missing_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot tell the trace's format"):
        read_trace(tmp_path / "trace.txt")
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no requests"):
        read_trace(tmp_path / "empty.jsonl")


def test_write_then_read_gives_the_same_requests_to_the_millisecond(tmp_path: Path) -> None:
    requests = [
        TraceRequest(0.0, 700, 20, (0, 1)),
        TraceRequest(0.2504, 513, 1, (0, 2)),
        TraceRequest(61.0, 1, 0, (3,)),
    ]
    buf = io.StringIO()
    assert write_mooncake(requests, buf) == 3
    path = tmp_path / "out.jsonl"
    path.write_text(buf.getvalue())
    back = read_trace(path).requests
    assert [(r.input_tokens, r.output_tokens, r.hash_ids) for r in back] == [
        (r.input_tokens, r.output_tokens, r.hash_ids) for r in requests
    ]
    assert [r.t_s for r in back] == [0.0, 0.25, 61.0]
