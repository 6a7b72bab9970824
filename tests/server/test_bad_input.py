"""Bad input gets an OpenAI error object with the right 4xx and a message naming the problem;
never a 5xx, and no process goes down."""

from __future__ import annotations

import json
from typing import Any, TypeAlias

import pytest
import requests

from tests.server.procs import Proc, key

pytestmark = pytest.mark.e2e
OK_MSGS = [{"role": "user", "content": "hi"}]


def chat(**fields: object) -> dict[str, Any]:
    return {"model": "llama-3-8b", "messages": OK_MSGS, **fields}


# (name, path, raw body or JSON object, headers, status, code, words in message)
Case: TypeAlias = tuple[str, str, bytes | dict[str, object], dict[str, str], int, str, str]
CASES: list[Case] = [
    ("invalid json", "/v1/chat/completions", b"{not json", {}, 400, "invalid_request", "JSON"),
    (
        "deep nesting",
        "/v1/chat/completions",
        b"[" * 100_000 + b"]" * 100_000,
        {},
        400,
        "invalid_request",
        "nests",
    ),
    (
        "bad request id",
        "/v1/chat/completions",
        chat(),
        {"X-Request-Id": "has space"},
        400,
        "invalid_request",
        "X-Request-Id",
    ),
    ("array body", "/v1/chat/completions", b"[1,2]", {}, 400, "invalid_request", "object"),
    (
        "missing messages",
        "/v1/chat/completions",
        {"model": "llama-3-8b"},
        {},
        400,
        "invalid_request",
        "messages",
    ),
    (
        "missing prompt",
        "/v1/completions",
        {"model": "llama-3-8b"},
        {},
        400,
        "invalid_request",
        "prompt",
    ),
    (
        "messages not a list",
        "/v1/chat/completions",
        chat(messages="hi"),
        {},
        400,
        "invalid_request",
        "messages",
    ),
    (
        "empty messages",
        "/v1/chat/completions",
        chat(messages=[]),
        {},
        400,
        "invalid_request",
        "messages",
    ),
    (
        "bad role",
        "/v1/chat/completions",
        chat(messages=[{"role": "robot", "content": "x"}]),
        {},
        400,
        "invalid_request",
        "role",
    ),
    (
        "max_tokens string",
        "/v1/chat/completions",
        chat(max_tokens="5"),
        {},
        400,
        "invalid_request",
        "max_tokens",
    ),
    (
        "stream string",
        "/v1/chat/completions",
        chat(stream="yes"),
        {},
        400,
        "invalid_request",
        "stream",
    ),
    (
        "max_tokens zero",
        "/v1/chat/completions",
        chat(max_tokens=0),
        {},
        400,
        "invalid_request",
        "max_tokens",
    ),
    (
        "max_tokens negative",
        "/v1/completions",
        {"model": "llama-3-8b", "prompt": "x", "max_tokens": -3},
        {},
        400,
        "invalid_request",
        "max_tokens",
    ),
    (
        "beyond context",
        "/v1/chat/completions",
        chat(max_tokens=40000),
        {},
        400,
        "too_long",
        "32768",
    ),
    (
        "unknown model",
        "/v1/chat/completions",
        {"model": "gpt-9", "messages": OK_MSGS},
        {},
        404,
        "model_not_found",
        "llama-3-8b",
    ),
    (
        "tools",
        "/v1/chat/completions",
        chat(tools=[{"type": "function"}]),
        {},
        400,
        "invalid_request",
        "tools",
    ),
    ("n=2", "/v1/chat/completions", chat(n=2), {}, 400, "invalid_request", "n"),
    (
        "logprobs",
        "/v1/chat/completions",
        chat(logprobs=True),
        {},
        400,
        "invalid_request",
        "logprobs",
    ),
    (
        "two prompts",
        "/v1/completions",
        {"model": "llama-3-8b", "prompt": ["a", "b"]},
        {},
        400,
        "invalid_request",
        "prompt",
    ),
    (
        "bad priority",
        "/v1/chat/completions",
        chat(),
        {"X-Priority": "urgent"},
        400,
        "invalid_request",
        "X-Priority",
    ),
    (
        "priority not allowed",
        "/v1/chat/completions",
        chat(),
        {"X-Priority": "critical"},
        403,
        "priority_not_allowed",
        "critical",
    ),
    (
        "bad prefix header",
        "/v1/chat/completions",
        chat(),
        {"X-Kvgate-Prefix-Tokens": "lots"},
        400,
        "invalid_request",
        "X-Kvgate-Prefix-Tokens",
    ),
    (
        "no key",
        "/v1/chat/completions",
        chat(),
        {"Authorization": ""},
        401,
        "invalid_api_key",
        "API key",
    ),
    (
        "unknown key",
        "/v1/chat/completions",
        chat(),
        {"Authorization": "Bearer kvg-x"},
        401,
        "invalid_api_key",
        "API key",
    ),
]


def _send(
    url: str, path: str, body: bytes | dict[str, object], headers: dict[str, str]
) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    merged = {**key("acme"), "Content-Type": "application/json", **headers}
    return requests.post(url + path, data=data, headers=merged, timeout=10)


def _check(resp: requests.Response, status: int, code: str, words: str) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == code and err["type"]
    assert words.lower() in err["message"].lower(), err["message"]


@pytest.mark.parametrize(("name", "path", "body", "headers", "status", "code", "words"), CASES)
def test_gateway_rejects(
    deployment: Proc,
    name: str,
    path: str,
    body: bytes | dict[str, object],
    headers: dict[str, str],
    status: int,
    code: str,
    words: str,
) -> None:
    _check(_send(deployment.url, path, body, headers), status, code, words)


@pytest.mark.parametrize("case", [c for c in CASES if c[5] != "too_long"], ids=lambda c: c[0])
def test_replica_rejects_the_same(standalone_replica: Proc, case: Case) -> None:
    _, path, body, headers, status, code, words = case
    _check(_send(standalone_replica.url, path, body, headers), status, code, words)


def test_body_too_large(deployment: Proc) -> None:
    big = json.dumps(chat(messages=[{"role": "user", "content": "x" * (9 << 20)}])).encode()
    _check(_send(deployment.url, "/v1/chat/completions", big, {}), 413, "body_too_large", "limit")


def test_odd_paths_and_admin(deployment: Proc) -> None:
    resp = requests.get(deployment.url + "/v1/chat/completions", timeout=5)
    assert resp.status_code == 405 and resp.json()["error"]["code"] == "method_not_allowed"
    resp = requests.get(deployment.url + "/v2/nothing", timeout=5)
    assert resp.status_code == 404 and "no endpoint" in resp.json()["error"]["message"]
    resp = requests.get(deployment.url + "/admin/replicas", headers=key("acme"), timeout=5)
    assert resp.status_code == 401 and "admin" in resp.json()["error"]["message"]
    resp = requests.get(
        deployment.url + "/debug/events", params={"after": "zz"}, headers=key("admin"), timeout=5
    )
    assert resp.status_code == 400 and "cursor" in resp.json()["error"]["message"]
    resp = requests.post(
        deployment.url + "/admin/replicas/r9/restart", headers=key("admin"), timeout=5
    )
    assert resp.status_code == 404
    resp = requests.post(
        deployment.url + "/admin/replicas/r0/restart", headers=key("admin"), timeout=5
    )
    assert resp.status_code == 409 and "running" in resp.json()["error"]["message"]


def test_everything_still_up_after_bad_input(deployment: Proc) -> None:
    health = requests.get(deployment.url + "/health", timeout=5).json()
    assert health["status"] == "ok"
    assert set(health["replicas"].values()) == {"running"}
    assert deployment.popen.poll() is None
    ledger = requests.get(deployment.url + "/admin/ledger", headers=key("admin"), timeout=5)
    assert ledger.json()["requests"] == 0, "rejected requests must leave nothing reserved"
    assert ledger.json()["drift_tokens"] == 0


def test_duplicate_request_id_in_flight(deployment: Proc) -> None:
    body = chat(max_tokens=20000, ignore_eos=True, stream=True)  # runs for seconds
    headers = {**key("acme"), "X-Request-Id": "dup-1"}
    with requests.post(
        deployment.url + "/v1/chat/completions",
        json=body,
        headers=headers,
        stream=True,
        timeout=10,
    ) as first:
        assert first.status_code == 200
        second = _send(deployment.url, "/v1/chat/completions", chat(), {"X-Request-Id": "dup-1"})
        _check(second, 400, "invalid_request", "already in flight")
