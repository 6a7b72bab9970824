"""The client and traffic classes against a real reference replica (plus fakes for the
endings a healthy replica never produces)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from locust.env import Environment

from contract import OUTCOMES, Outcome, RequestRecord
from tests.classes import subclass
from tests.waiting import wait_until
from tests.workloads.fakes import fake_server
from workloads.prompts import generator_for
from workloads.records import install_record_hook
from workloads.users import USER_CLASSES, KvgateUser

pytestmark = pytest.mark.e2e


def make_user(name: str, url: str, **overrides: Any) -> tuple[KvgateUser, list[RequestRecord]]:
    cls = subclass(f"Plan_{name}", USER_CLASSES[name], overrides)
    env = Environment(user_classes=[cls], host=url)
    records: list[RequestRecord] = []
    install_record_hook(env).add_listener(lambda record, **_kw: records.append(record))
    user = cls(env)
    user.on_start()
    return user, records


def run_task(user: KvgateUser, times: int = 1) -> None:
    (task,) = user.tasks
    assert callable(task)  # Locust types tasks as TaskSet instances; ours are functions
    for _ in range(times):
        task(user)


def server_events(url: str) -> list[dict[str, Any]]:
    req = urllib.request.Request(
        f"{url}/debug/events?after=0", headers={"Authorization": "Bearer kvg-admin-key"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return [json.loads(line) for line in resp.read().decode().splitlines() if line]


def test_every_outcome_is_reached_and_recorded(replica: str) -> None:
    records: list[RequestRecord] = []
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("ok", "short_qa_interactive", {"max_tokens": 8}),
        ("cancelled", "long_output", {"cancel_after_tokens": 3}),
        ("rejected", "short_qa_interactive", {"priority": "critical"}),
        ("error", "short_qa_interactive", {"api_key": "kvg-nobody"}),
        ("timeout", "long_output", {"timeout_s": 0.3}),
    ]
    for expected, name, overrides in cases:
        user, got = make_user(name, replica, prompt_tokens=32, **overrides)
        run_task(user)
        assert [r.outcome for r in got] == [expected], got
        records.extend(got)
    with fake_server() as fake:
        for expected, script in (("protocol_error", "malformed_sse"), ("disconnected", "drop")):
            user, got = make_user("batch", fake.url, extra_headers={"X-Fake": script})
            run_task(user)
            assert [r.outcome for r in got] == [expected]
            records.extend(got)
    assert {r.outcome for r in records} == set(OUTCOMES)
    by_outcome = {r.outcome: r for r in records}
    ok = by_outcome[Outcome.OK]
    assert ok.completion_tokens == ok.chunks == 8 and ok.replica == "r0"
    assert ok.ttft_s is not None and ok.e2e_s is not None and ok.ttft_s < ok.e2e_s
    rejected = by_outcome[Outcome.REJECTED]
    assert (rejected.http_status, rejected.error_code) == (403, "priority_not_allowed")
    assert rejected.error_message
    error = by_outcome[Outcome.ERROR]
    assert (error.http_status, error.error_code) == (401, "invalid_api_key")
    assert by_outcome[Outcome.TIMEOUT].error_code == "client_timeout"
    assert by_outcome[Outcome.CANCELLED].cancel_at is not None


def test_cancel_at_token_k_stops_and_releases_the_server_request(replica: str) -> None:
    user, records = make_user("long_output", replica, prompt_tokens=64, cancel_after_tokens=5)
    run_task(user)
    (record,) = records
    assert record.outcome == "cancelled" and record.chunks == 5

    def kinds() -> set[str]:
        return {e["event"] for e in server_events(replica) if e["request_id"] == record.request_id}

    wait_until(
        lambda: {"cancelled", "released"} <= kinds(),
        timeout_s=30,
        what="the replica to log the request cancelled and released",
    )
    assert "finished" not in kinds()  # it did not generate on to max_tokens


def test_prompts_hit_their_target_token_counts(replica: str) -> None:
    generator = generator_for(USER_CLASSES["long_context"].tokenizer_path)
    assert generator.exact
    for n in (1, 9, 777, 32_000):
        assert generator.count(generator.unique_text(n, seed=3, nonce=n)) == n
    overheads = set()
    for n in (16, 700, 4000):
        user, records = make_user("long_context", replica, prompt_tokens=n, max_tokens=2)
        run_task(user)
        (record,) = records
        assert record.outcome == "ok" and record.target_prompt_tokens == n
        assert record.prompt_tokens is not None
        overheads.add(record.prompt_tokens - n)
    (overhead,) = overheads  # the chat template's fixed cost, the same for every size
    assert 0 <= overhead <= 16


def test_public_prefix_is_shared_across_tenants(replica: str) -> None:
    cached = []
    for tenant_index in range(3):
        user, records = make_user(
            "shared_prefix", replica, public_share=1.0, public_prefixes=1, max_tokens=2
        )
        user.index = tenant_index
        user.on_start()
        run_task(user)
        cached.append((user.tenant, records[0].cached_tokens))
    assert len({tenant for tenant, _ in cached}) == 3
    assert all((tokens or 0) >= 2048 - 16 for _tenant, tokens in cached[1:]), cached
