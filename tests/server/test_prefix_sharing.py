"""Prefix sharing across tenants: a private prefix is never served from another tenant's
cache (cached_tokens 0); a prefix declared public is."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.server.procs import Proc, key

pytestmark = pytest.mark.e2e


def _cached(url: str, tenant: str, system: str, public: bool) -> int:
    headers = {**key(tenant), "X-Kvgate-Prefix-Tokens": "64"}
    if public:
        headers["X-Kvgate-Prefix-Public"] = "1"
    body: dict[str, Any] = {
        "model": "llama-3-8b",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": tenant}],
        "max_tokens": 2,
    }
    resp = requests.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
    assert resp.status_code == 200, resp.text
    return int(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


@pytest.mark.parametrize("via", ["replica", "gateway"])
def test_private_prefix_is_not_shared_public_is(
    deployment: Proc, standalone_replica: Proc, via: str
) -> None:
    url = standalone_replica.url if via == "replica" else deployment.url
    private = f"{via} confidential instructions for tenants only. " * 8
    assert _cached(url, "acme", private, public=False) == 0
    assert _cached(url, "acme", private, public=False) == 64  # same tenant: a hit
    assert _cached(url, "globex", private, public=False) == 0  # other tenant: never
    public = f"{via} public system prompt shared by every tenant. " * 8
    assert _cached(url, "acme", public, public=True) == 0
    assert _cached(url, "globex", public, public=True) == 64
    assert _cached(url, "initech", public, public=True) == 64
