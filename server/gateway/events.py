"""The gateway's view of every replica's event log, read from the state-dir files so that the
events of a replica that died are still served. The cursor is opaque to clients: it records
a byte offset per replica file ("r0:1234,r1:88"). A tenant reader gets only its own request
rows; the cursor moves over the others all the same."""

from __future__ import annotations

import json
import re
from pathlib import Path

from server.headers import parse_offset
from server.protocol import ApiError

SUFFIX = ".events.jsonl"
MAX_BYTES_PER_CALL = 4 * 1024 * 1024
MAX_CURSOR_PARTS = 64
# Replica ids are the gateway's own ("r0", "r1", ...); anything else in a cursor is not ours
# and must never be echoed into a header.
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _not_ours(raw: str) -> ApiError:
    shown = raw.encode("ascii", "backslashreplace").decode("ascii")
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ApiError(
        400,
        "invalid_request",
        f"cursor '{shown}' is not one this gateway gave out; pass the X-Next-Cursor "
        f"header of the previous answer, or omit 'after' to start over",
    )


def parse_cursor(raw: str) -> dict[str, int]:
    offsets: dict[str, int] = {}
    if not raw or raw == "-1":
        return offsets
    parts = raw.split(",")
    if len(parts) > MAX_CURSOR_PARTS:
        raise _not_ours(raw)
    for part in parts:
        name, sep, value = part.rpartition(":")
        if not sep or not _NAME.fullmatch(name):
            raise _not_ours(raw)
        try:
            offsets[name] = parse_offset(value, "cursor offset")
        except ApiError:
            raise _not_ours(raw) from None
    return offsets


def format_cursor(offsets: dict[str, int]) -> str:
    return ",".join(f"{name}:{off}" for name, off in sorted(offsets.items()))


def read_events(state_dir: Path, raw_cursor: str, tenant: str | None = None) -> tuple[bytes, str]:
    """Complete JSON lines past the cursor from every replica file, and the next cursor;
    with `tenant`, only that tenant's rows."""
    asked = parse_cursor(raw_cursor)
    offsets: dict[str, int] = {}
    out: list[bytes] = []
    budget = MAX_BYTES_PER_CALL
    for path in sorted(state_dir.glob(f"*{SUFFIX}")):
        name = path.name[: -len(SUFFIX)]
        start = min(asked.get(name, 0), path.stat().st_size)
        if budget <= 0:
            offsets[name] = start
            continue
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(budget)
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        if end:
            out.append(data[:end] if tenant is None else _only(data[:end], tenant))
            budget -= end
        offsets[name] = start + end
    return b"".join(out), format_cursor(offsets)


def _only(lines: bytes, tenant: str) -> bytes:
    kept = []
    for line in lines.splitlines(keepends=True):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("tenant") == tenant:
            kept.append(line)
    return b"".join(kept)
