"""SIGKILL a replica while 50 streams (and 10 batch requests) run: the gateway drops its
reservations, replays the replayable requests elsewhere exactly once, ends started streams
with an error event, and no request ever holds blocks on two replicas. The scenario is
harness/bench/release.py's, which also measures how soon the ledger settles."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import requests

from harness.bench.release import kill_during_streams
from tests.server.procs import Proc, events, key, start_deployment

pytestmark = pytest.mark.e2e
ADMIN = key("admin")
SETTLE_WAIT_S = 30.0


def test_kill_replica_during_streams(tmp_path: Path) -> None:
    dep: Proc = start_deployment(tmp_path, "--time-scale", "1.0")
    try:
        reps = requests.get(dep.url + "/admin/replicas", headers=ADMIN, timeout=5).json()
        victim = next(r for r in reps if r["id"] == "r0")
        # Raises unless the ledger settles (nothing held on r0, zero drift) within the wait:
        # a liveness bound; how soon it settles is `kvgate bench server --release`'s figure.
        results, _ = kill_during_streams(dep.url, "r0", victim["pid"], wait_s=SETTLE_WAIT_S)

        streams = [r for r in results if r["id"].startswith("s")]
        batches = [r for r in results if r["id"].startswith("b")]
        broken = [s for s in streams if '"replica_failed"' in s["text"]]
        assert broken, "no stream was on the killed replica"
        for s in broken:
            if s["status"] == 200:  # it had started: the SSE error event, then [DONE]
                assert s["replica"] == "r0" and s["text"].rstrip().endswith("data: [DONE]")
            else:  # still on its way to r0 and not replayable: a clean 503
                assert s["status"] == 503 and int(s["retry_after"]) >= 1
        for s in streams:
            if s not in broken:
                assert s["status"] == 200 and s["text"].count('"delta":{"content"') == 400
        for b in batches:  # replayable: all complete, on the survivor
            assert b["status"] == 200, b
            assert b["replica"] == "r1" and b["body"]["usage"]["completion_tokens"] == 300

        _assert_never_on_two_replicas(events(dep.url))
        metrics = requests.get(dep.url + "/metrics", headers=ADMIN, timeout=5).text
        assert 'kvgate_gateway_replica_up{replica="r0"} 0.0' in metrics
        assert "kvgate_gateway_retries_total 0.0" not in metrics

        restarted = requests.post(dep.url + "/admin/replicas/r0/restart", headers=ADMIN, timeout=60)
        assert restarted.status_code == 200, restarted.text
        info = restarted.json()
        assert info["state"] == "running" and info["pid"] != victim["pid"]
        assert info["port"] == victim["port"] and info["restarts"] == 1
    finally:
        dep.stop()


def _assert_never_on_two_replicas(rows: list[dict[str, Any]]) -> None:
    died = {r["replica"]: r["t"] for r in rows if r["event"] == "replica_died"}
    spans: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for r in rows:
        if r["request_id"]:
            span = spans[r["request_id"]].setdefault(r["replica"], [r["t"], r["t"]])
            span[0], span[1] = min(span[0], r["t"]), max(span[1], r["t"])
    moved = {rid: s for rid, s in spans.items() if len(s) > 1}
    assert moved, "no request was replayed"
    for rid, by_replica in moved.items():
        assert set(by_replica) == {"r0", "r1"}, (rid, by_replica)
        assert rid.startswith("b"), f"non-replayable {rid} ran twice"
        assert by_replica["r0"][1] <= died["r0"] <= by_replica["r1"][0], json.dumps(by_replica)
