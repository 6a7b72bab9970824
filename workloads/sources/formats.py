"""The public trace formats contract/trace.py reads: Mooncake JSONL and Azure's CSV."""

from __future__ import annotations

from pathlib import Path

from contract.trace import Trace, TraceFormat, read_trace
from workloads.sources.registry import trace_format


@trace_format(TraceFormat.MOONCAKE.value)
def read_mooncake(path: Path, block_tokens: int | None) -> Trace:
    """Mooncake JSONL: arrival, lengths and the prompt's block ids (512-token blocks unless
    the plan says otherwise)."""
    return read_trace(path, TraceFormat.MOONCAKE, block_tokens)


@trace_format(TraceFormat.AZURE.value)
def read_azure(path: Path, block_tokens: int | None) -> Trace:
    """Azure's LLM inference trace CSV: arrival and lengths, no blocks (every prompt is its
    own text, shared with none)."""
    return read_trace(path, TraceFormat.AZURE)
