"""Hostile input against both apps: the fixed corpus (every kind of input that once answered
500 or dropped the connection, plus parser-level garbage) and hypothesis-generated bodies and
headers. Every answer is 2xx or a 4xx OpenAI error object; no process dies; RSS stays
bounded."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bench.hostile import Case, build, chat, corpus, exchange, problem
from tests.server.procs import Proc, key, start_replica

pytestmark = pytest.mark.e2e
RSS_GROWTH_LIMIT = 300 << 20  # generous: a leak of the 7 MB prompt per request would pass it
CORPUS = corpus()
HEADERS = [
    "X-Request-Id",
    "X-Priority",
    "X-Kvgate-Prefix-Tokens",
    "Authorization",
    "X-Kvgate-Debug-Timing",
]


def _targets(deployment: Proc, standalone_replica: Proc) -> list[str]:
    return [deployment.url, standalone_replica.url, deployment.ready["replicas"][0]["url"]]


def _send(url: str, case: Case) -> None:
    answer = exchange(url, build(case, url.removeprefix("http://")))
    assert problem(answer) is None, f"{case.name} -> {url}: {problem(answer)}"


def _rss(pids: list[int]) -> int:
    return sum(psutil.Process(p).memory_info().rss for p in pids)


def _pids(deployment: Proc, standalone_replica: Proc) -> list[int]:
    reps = [int(r["pid"]) for r in deployment.ready["replicas"]]
    return [deployment.popen.pid, standalone_replica.popen.pid, *reps]


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_corpus_case_answers_4xx_json(
    deployment: Proc, standalone_replica: Proc, case: Case
) -> None:
    for url in _targets(deployment, standalone_replica):
        _send(url, case)


def test_the_issue_cases_get_the_right_answer(deployment: Proc, standalone_replica: Proc) -> None:
    by_name = {c.name: c for c in CORPUS}
    host = deployment.url.removeprefix("http://")
    for url in (deployment.url, standalone_replica.url):
        for name, status in (
            ("int_5000_digits", 400),
            ("surrogate_escape", 400),
            ("surrogate_raw_bytes", 400),
            ("prompt_7mb", 400),
            ("cursor_crlf_name", 400),
            ("method_not_allowed", 405),
        ):
            answer = exchange(url, build(by_name[name], host))
            assert answer.status == status, (name, answer.body)
        for value in ("²", "+5", "9" * 5000, "٣"):
            case = Case(
                "prefix", headers=((b"X-Kvgate-Prefix-Tokens", value.encode()),), body=chat()
            )
            answer = exchange(url, build(case, host))
            assert answer.status == 400 and b"X-Kvgate-Prefix-Tokens" in answer.body
        gz = Case("gz", headers=((b"Content-Encoding", b"gzip"),), body=b"\x1f\x8b...")
        answer = exchange(url, build(gz, host))
        assert answer.status == 415 and b"Content-Encoding" in answer.body
    too_long = json.loads(exchange(deployment.url, build(by_name["prompt_7mb"], host)).body)
    assert too_long["error"]["code"] == "too_long" and "at least" in too_long["error"]["message"]
    mna = json.loads(exchange(deployment.url, build(by_name["method_not_allowed"], host)).body)
    assert mna["error"]["type"] == "invalid_request_error"


@st.composite
def hostile_case(draw: st.DrawFn) -> Case:
    base = bytearray(chat())
    kind = draw(st.sampled_from(["splice", "cut", "json", "header"]))
    headers: tuple[tuple[bytes, bytes], ...] = ()
    if kind == "splice":
        pos = draw(st.integers(0, len(base)))
        base[pos:pos] = draw(
            st.binary(max_size=40)
            | st.sampled_from([b"\\ud800", b"\xed\xa0\x80", b"9" * 4400, b"[" * 2000])
        )
    elif kind == "cut":
        base = base[: draw(st.integers(0, len(base)))]
    elif kind == "json":
        value = draw(
            st.recursive(
                st.none()
                | st.booleans()
                | st.integers()
                | st.floats()
                | st.text(st.characters(codec="utf-8")),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3)
                ),
                max_leaves=8,
            )
        )
        field = draw(st.sampled_from(["max_tokens", "messages", "stream", "stream_options", "x"]))
        base = bytearray(chat(**{field: value}))
    else:
        raw = draw(st.binary(max_size=120).filter(lambda b: b"\r" not in b and b"\n" not in b))
        headers = ((draw(st.sampled_from(HEADERS)).encode(), raw.strip()),)
    return Case(f"hypothesis-{kind}", headers=headers, body=bytes(base))


@pytest.fixture(scope="module")
def rss_baseline(deployment: Proc, standalone_replica: Proc) -> Iterator[int]:
    pids = _pids(deployment, standalone_replica)
    before = _rss(pids)
    yield before
    for pid in pids:
        assert psutil.pid_exists(pid), f"process {pid} died under hostile input"
    assert _rss(pids) - before < RSS_GROWTH_LIMIT


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=hostile_case(), target=st.integers(0, 1))
def test_hypothesis_hostile_bodies_and_headers(
    deployment: Proc, standalone_replica: Proc, rss_baseline: int, case: Case, target: int
) -> None:
    _send((deployment.url, standalone_replica.url)[target], case)


def test_processes_alive_and_rss_bounded_after_everything(
    deployment: Proc, standalone_replica: Proc, rss_baseline: int
) -> None:
    for url in (deployment.url, standalone_replica.url):
        assert requests.get(url + "/health", timeout=5).status_code == 200
    for url in _targets(deployment, standalone_replica):
        _send(url, Case("health", b"GET", b"/health"))


def test_unknown_fields_are_ignored_with_a_warning(deployment: Proc) -> None:
    body: dict[str, Any] = {
        "model": "llama-3-8b",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "frobnicate_xyz": 1,
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    resp = requests.post(
        deployment.url + "/v1/chat/completions", json=body, headers=key("acme"), timeout=10
    )
    assert resp.status_code == 200, resp.text
    assert "'frobnicate_xyz'" in deployment.output()
    assert "'top_k'" not in deployment.output()  # a known extension: accepted, no warning


def test_continuous_usage_stats_puts_usage_on_every_chunk(deployment: Proc) -> None:
    body: dict[str, Any] = {
        "model": "llama-3-8b",
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 6,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with requests.post(
        deployment.url + "/v1/chat/completions",
        json=body,
        headers=key("acme"),
        stream=True,
        timeout=10,
    ) as resp:
        assert resp.status_code == 200
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith(b"data: {")]
    assert all("usage" in e for e in events), events
    prompt = events[0]["usage"]["prompt_tokens"]
    completion = [e["usage"]["completion_tokens"] for e in events]
    assert completion == sorted(completion) and completion[-1] == 6
    tokens = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert [e["usage"]["completion_tokens"] for e in tokens] == [1, 2, 3, 4, 5, 6]
    assert all(
        e["usage"]["total_tokens"] == prompt + e["usage"]["completion_tokens"] for e in events
    )
    final = events[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 6


def test_escalation_refusals_count_under_the_asking_tenant(deployment: Proc) -> None:
    resp = requests.post(
        deployment.url + "/v1/chat/completions",
        json={"model": "llama-3-8b", "messages": [{"role": "user", "content": "x"}]},
        headers={**key("globex"), "X-Priority": "critical"},
        timeout=10,
    )
    assert resp.status_code == 403
    metrics = requests.get(deployment.url + "/metrics", headers=key("admin"), timeout=5).text
    line = 'kvgate_gateway_rejected_requests_total{code="priority_not_allowed",tenant="globex"}'
    assert line in metrics


def test_slow_bodies_idle_connections_and_connection_cap(tmp_path: Path) -> None:
    rep = start_replica(
        tmp_path,
        "--time-scale", "0.02",
        "--body-timeout", "1",
        "--idle-timeout", "1",
        "--max-client-connections", "3",
    )  # fmt: skip
    try:
        host = rep.url.removeprefix("http://")
        slow = Case("slow", headers=((b"Content-Length", b"100"),), body=b"{", auto_length=False)
        answer = exchange(rep.url, build(slow, host))
        assert answer.status == 408 and b"did not arrive" in answer.body
        idle = exchange(rep.url, b"GET /health HTTP/1.1\r\nHost: x\r\n")  # head never ends
        # closed by the server's idle timeout, not left open until our own 30 s ran out
        assert idle.status is None and not idle.timed_out
        held = [socket.create_connection(("127.0.0.1", int(rep.ready["port"]))) for _ in range(3)]
        try:
            over = exchange(rep.url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert over.status == 429 and b"too_many_connections" in over.body
        finally:
            for s in held:
                s.close()
        assert rep.popen.poll() is None
    finally:
        rep.stop()
