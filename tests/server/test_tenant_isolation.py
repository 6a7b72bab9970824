"""Tenants cannot see or block each other: request ids are scoped per tenant, a tenant key
reads only its own events, and observability endpoints need a key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.server.procs import Proc, key, start_deployment

pytestmark = pytest.mark.e2e
LONG: dict[str, Any] = {
    "model": "llama-3-8b",
    "messages": [{"role": "user", "content": "go on"}],
    "max_tokens": 20000,
    "ignore_eos": True,
    "stream": True,
}
SHORT: dict[str, Any] = {
    "model": "llama-3-8b",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 2,
}


def _events(url: str, who: str) -> list[dict[str, Any]]:
    resp = requests.get(url + "/debug/events", headers=key(who), timeout=10)
    assert resp.status_code == 200, resp.text
    return [json.loads(line) for line in resp.text.splitlines() if line]


def test_a_tenant_cannot_collide_with_or_read_another_tenants_ids(deployment: Proc) -> None:
    url = deployment.url + "/v1/chat/completions"
    rid = {"X-Request-Id": "isolation-shared-1"}
    with requests.post(
        url, json=LONG, headers={**key("acme"), **rid}, stream=True, timeout=10
    ) as first:
        assert first.status_code == 200
        # globex reuses acme's in-flight id: its own request, not "already in flight"
        other = requests.post(url, json=SHORT, headers={**key("globex"), **rid}, timeout=10)
        assert other.status_code == 200, other.text
        assert other.headers["X-Request-Id"] == "isolation-shared-1"
        # the same tenant reusing its own in-flight id is still refused
        again = requests.post(url, json=SHORT, headers={**key("acme"), **rid}, timeout=10)
        assert again.status_code == 400 and "already in flight" in again.json()["error"]["message"]
    globex_rows = _events(deployment.url, "globex")
    assert globex_rows and {r["tenant"] for r in globex_rows} == {"globex"}
    acme_rows = _events(deployment.url, "acme")
    assert {r["tenant"] for r in acme_rows} == {"acme"}
    assert any(r["request_id"] == "isolation-shared-1" for r in acme_rows)
    everyone = _events(deployment.url, "admin")
    tenants = {r["tenant"] for r in everyone if r["request_id"] == "isolation-shared-1"}
    assert tenants == {"acme", "globex"}  # the client's id in both rows, each its own tenant


def test_observability_needs_a_key(deployment: Proc) -> None:
    for path in ("/debug/events", "/debug/info", "/info", "/metrics"):
        resp = requests.get(deployment.url + path, timeout=5)
        assert resp.status_code == 401, path
        assert resp.json()["error"]["code"] == "invalid_api_key"
    assert (
        requests.get(deployment.url + "/metrics", headers=key("acme"), timeout=5).status_code == 401
    )
    assert requests.get(deployment.url + "/debug/info", headers=key("acme"), timeout=5).ok
    assert requests.get(deployment.url + "/metrics", headers=key("admin"), timeout=5).ok
    assert requests.get(deployment.url + "/health", timeout=5).ok


def test_keyless_metrics_bind(tmp_path: Path) -> None:
    dep = start_deployment(tmp_path, "--time-scale", "0.02", "--metrics-port", "0", replicas=1)
    try:
        metrics_url = dep.ready["metrics_url"]
        assert metrics_url.startswith("http://127.0.0.1:")
        text = requests.get(metrics_url, timeout=5).text
        assert "kvgate_gateway_replica_up" in text
        other = requests.get(metrics_url.replace("/metrics", "/debug/events"), timeout=5)
        assert other.status_code == 404  # only /metrics is open there
    finally:
        dep.stop()
