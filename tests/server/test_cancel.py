"""Closing the connection cancels the request: 200 clients disconnect mid-stream through the
gateway, and each request is cancelled and then released, by the replica that held it.

How fast the release follows the disconnect is a figure of `kvgate bench server --release`
(harness/bench/release.py, which owns this storm); a test on a shared machine cannot tell a
slow release from a busy neighbour, so here only what happens, and in what order, is checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.bench.release import disconnect_storm, releases
from tests.server.procs import TEST_TENANTS, start_deployment

pytestmark = pytest.mark.e2e
CANCELS = 200
# Liveness only: a release that has not come this long after its disconnect is a leak.
RELEASE_WAIT_S = 30.0


def test_every_disconnect_is_cancelled_then_released_by_its_replica(tmp_path: Path) -> None:
    dep = start_deployment(
        tmp_path, "--time-scale", "1.0", "--tenants", str(TEST_TENANTS), replicas=1
    )
    try:
        closed = disconnect_storm(dep.url, CANCELS, wave=20)
        released, rows = releases(dep.url, closed, wait_s=RELEASE_WAIT_S)
    finally:
        dep.stop()
    assert len(closed) == CANCELS
    assert set(released) == set(closed), f"{len(closed) - len(released)} never released"
    mine = [e for e in rows if e["request_id"] in closed]
    for rid in closed:
        story = [e for e in mine if e["request_id"] == rid]
        kinds = [e["event"] for e in story]
        # admitted on the one replica, cancelled by the disconnect, released once, in order
        assert kinds.count("released") == 1 and kinds.count("cancelled") == 1, (rid, kinds)
        assert kinds.index("admitted") < kinds.index("cancelled") < kinds.index("released")
        assert {e["replica"] for e in story} == {"r0"}, (rid, story)
        cancel = next(e for e in story if e["event"] == "cancelled")
        assert closed[rid] <= cancel["t"], "a cancel recorded before its client closed"
