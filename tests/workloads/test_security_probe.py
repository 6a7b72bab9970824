"""The security_probe traffic class: escalation probes and private-prefix probe groups."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

import contract
from tests.workloads.fakes import FakeServer, fake_server
from tests.workloads.test_users import make_user, run_task, sent


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with fake_server(tokens=2) as srv:
        yield srv


def test_escalation_probes_ask_for_priorities_their_keys_do_not_allow(
    server: FakeServer,
) -> None:
    user, records = make_user(
        "security_probe",
        server.url,
        escalations=(
            ("kvg-batch-key", "batchco-demo", "batchco", "critical"),
            ("kvg-acme-key", "acme-demo", "acme", "critical"),
        ),
        send_priority_header=False,
    )
    run_task(user)
    by_id = {r.request_id: r for r in records}
    escalations = [
        (headers, by_id[headers["x-request-id"]])
        for headers, _body in sent(server)
        if by_id[headers["x-request-id"]].probe == "escalation"
    ]
    assert [(h["authorization"], h["x-priority"]) for h, _r in escalations] == [
        ("Bearer kvg-batch-key", "critical"),
        ("Bearer kvg-acme-key", "critical"),
    ]
    # Recorded under the key's tenant at the priority asked (never as work of the class the
    # key does allow), with the header it sent, even though the plan turned headers off.
    assert [(r.tenant, r.api_key_name, r.priority, r.asked_priority) for _h, r in escalations] == [
        ("batchco", "batchco-demo", "critical", "critical"),
        ("acme", "acme-demo", "critical", "critical"),
    ]
    assert all(r.probe_group is None for _h, r in escalations)


def test_a_prefix_probe_group_warms_as_one_tenant_and_probes_as_another(
    server: FakeServer,
) -> None:
    user, records = make_user("security_probe", server.url, escalations=(), prefix_tokens=64)
    run_task(user)
    requests = sent(server)
    assert len(requests) == len(records) == 3
    by_role = {
        r.probe: (r, *next((h, b) for h, b in requests if h["x-request-id"] == r.request_id))
        for r in records
    }
    assert set(by_role) == set(contract.PROBE_ROLES) - {"escalation"}
    warm, probe, control = (by_role[k] for k in ("prefix_warm", "prefix_probe", "prefix_control"))
    assert warm[1]["authorization"] == "Bearer kvg-acme-key" and warm[0].tenant == "acme"
    for record, headers, _body in (probe, control):
        assert headers["authorization"] == "Bearer kvg-globex-key" and record.tenant == "globex"
    for record, headers, body in (warm, probe, control):
        assert headers["x-kvgate-prefix-tokens"] == "64"
        assert "x-kvgate-prefix-public" not in headers  # private
        assert len(body["messages"][0]["content"].split()) == 64
        assert record.probe_group == warm[0].probe_group and record.probe_group
        assert record.cached_tokens == 16  # read from usage.prompt_tokens_details
    system = {role: entry[2]["messages"][0]["content"] for role, entry in by_role.items()}
    assert system["prefix_probe"] == system["prefix_warm"]
    # Same shape, another nonce: it differs from its very first words.
    assert system["prefix_control"].split()[0:8] != system["prefix_warm"].split()[0:8]
    assert system["prefix_control"].split()[8:] == system["prefix_warm"].split()[8:]
    assert requests[0][0]["x-request-id"] == warm[0].request_id  # the warm request goes first


def test_each_group_has_a_fresh_prefix_and_probe_and_control_take_turns_first(
    server: FakeServer,
) -> None:
    user, records = make_user("security_probe", server.url, escalations=(), prefix_tokens=32)
    for _ in range(12):
        run_task(user)
    warm = [r for r in records if r.probe == "prefix_warm"]
    contents = {
        body["messages"][0]["content"]
        for headers, body in sent(server)
        if headers["x-request-id"] in {r.request_id for r in warm}
    }
    assert len(warm) == len(contents) == len({r.probe_group for r in warm}) == 12
    second = Counter(records[i + 1].probe for i in range(0, len(records), 3))
    assert second["prefix_probe"] > 0 and second["prefix_control"] > 0


def test_a_warm_request_that_fails_ends_its_group(server: FakeServer) -> None:
    user, records = make_user(
        "security_probe", server.url, escalations=(), extra_headers={"X-Fake": "reject"}
    )
    run_task(user)
    assert [(r.probe, r.outcome) for r in records] == [("prefix_warm", "rejected")]


def test_a_held_warm_request_is_still_streaming_when_probe_and_control_go_out() -> None:
    """hold_warm_tokens: the probe goes out once the warm request has streamed its first
    token and before it ends, so its prefix is held by a live request; the warm request asks
    for that many tokens, and the group still waits for it to finish."""
    with fake_server(tokens=40, gap_s=0.02) as srv:
        user, records = make_user(
            "security_probe", srv.url, escalations=(), prefix_tokens=32, hold_warm_tokens=40
        )
        run_task(user)
        bodies = {h["x-request-id"]: b for h, b in sent(srv)}
    by_role = {r.probe: r for r in records}
    warm = by_role["prefix_warm"]
    assert warm.outcome == "ok" and bodies[warm.request_id]["max_tokens"] == 40
    warm_end = warm.t_send + (warm.e2e_s or 0.0)
    for role in ("prefix_probe", "prefix_control"):
        other = by_role[role]
        assert warm.t_send + (warm.ttft_s or 0.0) <= other.t_send < warm_end, role
        assert bodies[other.request_id]["max_tokens"] == 8  # the class's own
