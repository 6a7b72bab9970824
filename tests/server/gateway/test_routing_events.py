"""Routing (least committed, prefix affinity) and the gateway's event cursor over files."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.gateway.events import read_events
from server.gateway.routing import AFFINITY_SLACK_TOKENS, Router, prefix_key
from server.protocol import ApiError


def test_least_committed_wins_without_prefix() -> None:
    r = Router()
    assert r.pick(["r0", "r1"], {"r0": 500, "r1": 20}, None) == "r1"
    assert r.pick(["r0", "r1"], {}, None) == "r0"
    assert r.pick([], {}, None) is None


def test_prefix_sticks_until_its_replica_is_much_busier() -> None:
    r = Router()
    key = prefix_key("acme", False, [1, 2, 3])
    assert r.pick(["r0", "r1"], {"r0": 10, "r1": 0}, key) == "r1"
    assert r.pick(["r0", "r1"], {"r0": 0, "r1": 1000}, key) == "r1"  # affinity
    busy = {"r0": 0, "r1": AFFINITY_SLACK_TOKENS + 1}
    assert r.pick(["r0", "r1"], busy, key) == "r0"  # too busy: moves
    assert r.pick(["r1"], {}, key) == "r1"  # its home is gone


def test_prefix_keys_separate_tenants_unless_public() -> None:
    assert prefix_key("acme", False, [1, 2]) != prefix_key("globex", False, [1, 2])
    assert prefix_key("acme", True, [1, 2]) == prefix_key("globex", True, [1, 2])


def test_event_cursor_reads_complete_lines_per_file(tmp_path: Path) -> None:
    (tmp_path / "r0.events.jsonl").write_text('{"seq":0}\n{"seq":1}\n{"seq":2')
    (tmp_path / "r1.events.jsonl").write_text('{"seq":0}\n')
    body, cursor = read_events(tmp_path, "")
    assert body.count(b"\n") == 3 and cursor == "r0:20,r1:10"
    with (tmp_path / "r0.events.jsonl").open("a") as fh:
        fh.write("}\n")
    body, cursor = read_events(tmp_path, cursor)
    assert body == b'{"seq":2}\n' and cursor == "r0:30,r1:10"
    assert read_events(tmp_path, cursor) == (b"", cursor)
    with pytest.raises(ApiError, match="X-Next-Cursor"):
        read_events(tmp_path, "r0=5")
