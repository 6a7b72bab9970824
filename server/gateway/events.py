"""The gateway's view of every replica's event log, read from the state-dir files so that the
events of a replica that died are still served. The cursor is opaque to clients: it records
a byte offset per replica file ("r0:1234,r1:88")."""

from __future__ import annotations

from pathlib import Path

from server.protocol import ApiError

SUFFIX = ".events.jsonl"
MAX_BYTES_PER_CALL = 4 * 1024 * 1024


def parse_cursor(raw: str) -> dict[str, int]:
    offsets: dict[str, int] = {}
    if not raw or raw == "-1":
        return offsets
    for part in raw.split(","):
        name, sep, value = part.rpartition(":")
        if not sep or not name or not value.isdigit():
            raise ApiError(
                400,
                "invalid_request",
                f"cursor '{raw}' is not one this gateway gave out; pass the X-Next-Cursor "
                f"header of the previous answer, or omit 'after' to start over",
            )
        offsets[name] = int(value)
    return offsets


def format_cursor(offsets: dict[str, int]) -> str:
    return ",".join(f"{name}:{off}" for name, off in sorted(offsets.items()))


def read_events(state_dir: Path, raw_cursor: str) -> tuple[bytes, str]:
    """Complete JSON lines past the cursor from every replica file, and the next cursor."""
    offsets = parse_cursor(raw_cursor)
    out: list[bytes] = []
    budget = MAX_BYTES_PER_CALL
    for path in sorted(state_dir.glob(f"*{SUFFIX}")):
        name = path.name[: -len(SUFFIX)]
        start = offsets.get(name, 0)
        if budget <= 0:
            offsets.setdefault(name, start)
            continue
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(budget)
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        if end:
            out.append(data[:end])
            budget -= end
        offsets[name] = start + end
    return b"".join(out), format_cursor(offsets)
