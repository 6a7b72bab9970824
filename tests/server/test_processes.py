"""Process lifecycle and observability: serve starts and stops everything it started; a
standalone replica authenticates keys itself and trusts only the deployment's secret."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.server.procs import Proc, events, key, start_deployment, start_replica
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e
CHAT: dict[str, Any] = {
    "model": "llama-3-8b",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 3,
}


def test_serve_prints_writes_ready_and_stops_everything(tmp_path: Path) -> None:
    dep = start_deployment(tmp_path, "--time-scale", "0.02", replicas=2)
    try:
        ready = dep.ready
        assert ready["pid"] == dep.popen.pid and len(ready["replicas"]) == 2
        pids = [r["pid"] for r in ready["replicas"]]
        assert all(psutil.pid_exists(p) for p in pids)
        out = dep.output()
        assert f"kvgate: gateway listening on {ready['gateway_url']}" in out
        for r in ready["replicas"]:
            assert f"kvgate: replica {r['id']} pid={r['pid']} port={r['port']}" in out
        listing = requests.get(dep.url + "/admin/replicas", headers=key("admin"), timeout=5)
        assert [(r["id"], r["state"]) for r in listing.json()] == [
            ("r0", "running"),
            ("r1", "running"),
        ]
        info = requests.get(dep.url + "/info", headers=key("acme"), timeout=5).json()
        assert requests.get(dep.url + "/debug/info", headers=key("admin"), timeout=5).json() == info
        replica_url = ready["replicas"][0]["url"]
        replica_info = requests.get(replica_url + "/info", headers=key("admin"), timeout=5).json()
        assert info["replicas"] == 2 and replica_info["replica"] == "r0"
        assert info["scheduler_config_digest"] == replica_info["scheduler_config_digest"]
        assert len(info["scheduler_config_digest"]) == 64 and info["gpu_sku"] == "h100-80gb"
        assert info["config"]["kv_pool_gib"] == 52 and info["time_scale"] == 0.02
        os.kill(dep.popen.pid, signal.SIGTERM)
        assert dep.popen.wait(60) == 0
        wait_until(lambda: not any(_alive(p) for p in pids), timeout_s=30, what="replicas to exit")
    finally:
        dep.stop()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_standalone_replica_endpoints(tmp_path: Path) -> None:
    rep: Proc = start_replica(tmp_path, "--time-scale", "0.02", "--gpu", "h200-141gb")
    try:
        url = rep.url
        ok = requests.post(url + "/v1/chat/completions", json=CHAT, headers=key("acme"), timeout=10)
        assert ok.status_code == 200 and ok.headers["X-Kvgate-Replica"] == "r0"
        assert ok.headers["X-Kvgate-Quota-Limit-Tokens"] == "131072"
        forged = {
            "X-Kvgate-Internal-Token": "guess",
            "X-Kvgate-Tenant": "system",
            "X-Kvgate-Priority": "critical",
        }
        resp = requests.post(url + "/v1/chat/completions", json=CHAT, headers=forged, timeout=10)
        assert resp.status_code == 401, "a standalone replica has no secret to match"
        models = requests.get(url + "/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == "llama-3-8b"
        gpu = requests.get(url + "/debug/gpu", headers=key("admin"), timeout=5).json()
        assert gpu["sku"] == "h200-141gb" and gpu["total_bytes"] == 143771 << 20
        assert gpu["used_bytes"] == sum(gpu["by_category"].values())
        assert set(gpu["by_category"]) >= {"weights", "kv_cache", "activations"}
        metrics = requests.get(url + "/metrics", headers=key("admin"), timeout=5).text
        for name in (
            "kvgate_pool_blocks_total",
            "kvgate_pool_usage_ratio",
            'kvgate_waiting_requests{priority="batch"}',
            "kvgate_tenant_reserved_tokens",
            "kvgate_release_latency_seconds_bucket",
            "kvgate_step_lag_seconds_bucket",
            "kvgate_step_lag_max_seconds",
            'kvgate_sim_gpu_memory_used_bytes{category="weights"}',
            "kvgate_sim_gpu_memory_total_bytes",
            "kvgate_oom_total",
            "kvgate_prefix_cache_hits_total",
            "kvgate_fragmentation_ratio",
        ):
            assert name in metrics, name
        rows = events(url)
        assert [r["seq"] for r in rows] == list(range(len(rows)))
        assert {"replica_started", "admitted", "finished", "released"} <= {r["event"] for r in rows}
        on_disk = (tmp_path / "state" / "r0.events.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in on_disk] == rows
    finally:
        rep.stop()


def test_debug_timing_stamps_every_chunk(deployment: Proc) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.time()
    resp = requests.post(
        deployment.url + "/v1/chat/completions",
        json=body,
        timeout=10,
        headers={**key("acme"), "X-Kvgate-Debug-Timing": "1", "X-Request-Id": "timing-1"},
    )
    assert resp.headers["X-Request-Id"] == "timing-1"
    chunks = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    assert len(chunks) >= 5
    stamps = [c["kvgate_emit_ts"] for c in chunks]
    assert stamps == sorted(stamps) and t0 <= stamps[0] <= time.time()


def test_deployment_replica_takes_only_its_gateway(deployment: Proc) -> None:
    """A tenant key straight to a replica would bypass the gateway's global ledger."""
    replica = deployment.ready["replicas"][1]["url"]
    spoof = {"X-Kvgate-Tenant": "system", "X-Kvgate-Priority": "critical"}
    for headers in (key("tiny"), {**key("tiny"), **spoof}, key("admin"), spoof):
        resp = requests.post(
            replica + "/v1/chat/completions", json=CHAT, timeout=10, headers=headers
        )
        assert resp.status_code == 401, resp.text
        assert "gateway" in resp.json()["error"]["message"]
    resp = requests.post(
        replica + "/v1/chat/completions",
        json=CHAT,
        timeout=10,
        headers={**spoof, "X-Kvgate-Internal-Token": "0" * 32},
    )
    assert resp.status_code == 401
    for path in ("/metrics", "/debug/events", "/debug/reservations", "/info"):
        assert requests.get(replica + path, headers=key("tiny"), timeout=5).status_code == 401
        assert requests.get(replica + path, headers=key("admin"), timeout=5).status_code == 200


def test_standalone_replica_ignores_identity_headers_without_the_secret(
    standalone_replica: Proc,
) -> None:
    replica = standalone_replica.url
    spoof = {"X-Kvgate-Tenant": "system", "X-Kvgate-Priority": "critical"}
    resp = requests.post(
        replica + "/v1/chat/completions", json=CHAT, timeout=10, headers={**key("tiny"), **spoof}
    )
    assert resp.status_code == 200
    assert resp.headers["X-Kvgate-Quota-Limit-Tokens"] == "2048"  # the key's tenant, tiny
    resp = requests.post(
        replica + "/v1/chat/completions",
        json=CHAT,
        timeout=10,
        headers={**key("tiny"), "X-Priority": "critical"},
    )
    assert resp.status_code == 403
    resp = requests.post(
        replica + "/v1/chat/completions",
        json=CHAT,
        timeout=10,
        headers={**spoof, "X-Kvgate-Internal-Token": "0" * 32},
    )
    assert resp.status_code == 401


def test_replicas_do_not_outlive_a_killed_serve(tmp_path: Path) -> None:
    dep = start_deployment(tmp_path, "--time-scale", "0.02", replicas=1)
    pids = [r["pid"] for r in dep.ready["replicas"]]
    try:
        os.kill(dep.popen.pid, signal.SIGKILL)
        dep.popen.wait(30)
        wait_until(
            lambda: not any(_alive(p) for p in pids),
            timeout_s=30,
            what="the orphaned replica to stop itself",
        )
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        dep.stop()
