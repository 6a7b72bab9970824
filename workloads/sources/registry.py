"""The trace formats a replay reads: each reader registers itself under its format's name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

from contract.trace import Trace

# A reader: the trace file and the block size the plan gives (None: the format's own), to
# the whole trace; contract.trace.TraceError names the file, the line and what to change.
TraceReader = Callable[[Path, int | None], Trace]
TRACE_FORMATS: Final[dict[str, TraceReader]] = {}


def trace_format(name: str) -> Callable[[TraceReader], TraceReader]:
    """Registers a reader as the format `name` (what a plan's `traffic.trace.format` says)."""

    def register(reader: TraceReader) -> TraceReader:
        if name in TRACE_FORMATS:
            raise ValueError(f"trace format {name!r} is registered twice")
        TRACE_FORMATS[name] = reader
        return reader

    return register
