"""Traffic classes: what each sends, overridable by subclassing, one record per request."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import gevent
import pytest
from locust.env import Environment
from locust.exception import StopUser
from locust.user.task import LOCUST_STATE_STOPPING

from contract import RequestRecord
from tests.classes import subclass
from tests.waiting import wait_until
from tests.workloads.fakes import FakeServer, fake_server
from workloads.records import install_record_hook
from workloads.users import USER_CLASSES, KvgateUser
from workloads.users import base as users_base


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with fake_server(tokens=5) as srv:
        yield srv


def make_user(name: str, url: str, **overrides: Any) -> tuple[KvgateUser, list[RequestRecord]]:
    cls = subclass(f"Plan_{name}", USER_CLASSES[name], {"prompt_tokens": 16, **overrides})
    env = Environment(user_classes=[cls], host=url)
    records: list[RequestRecord] = []
    install_record_hook(env).add_listener(lambda record, **_kw: records.append(record))
    user = cls(env)
    user.on_start()
    return user, records


def run_task(user: KvgateUser) -> None:
    (task,) = user.tasks
    assert callable(task)  # Locust types tasks as TaskSet instances; ours are functions
    task(user)


def sent(server: FakeServer) -> list[tuple[dict[str, str], dict[str, Any]]]:
    return [(headers, json.loads(body)) for headers, body in server.requests]


class Shape:
    """A load shape that counts how often a user read its phases (twice per poll)."""

    def __init__(self, phases: list[dict[str, Any]], finished: bool) -> None:
        self._phases, self.finished, self.polls = phases, finished, 0

    @property
    def phases(self) -> list[dict[str, Any]]:
        self.polls += 1
        return self._phases

    @phases.setter
    def phases(self, phases: list[dict[str, Any]]) -> None:
        self._phases = phases


@pytest.fixture
def fast_phase_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(users_base, "PHASE_POLL_S", 0.01)


def test_long_context_is_32k_tokens() -> None:
    assert USER_CLASSES["long_context"].prompt_tokens == 32_000


@pytest.mark.parametrize("name", sorted(USER_CLASSES))
def test_every_class_streams_with_usage_and_records_each_request(
    server: FakeServer, name: str
) -> None:
    user, records = make_user(name, server.url, burst_size=3, max_tokens=32)
    run_task(user)
    requests = sent(server)
    assert requests and len(records) == len(requests)
    # The security probe sends as other tenants on purpose (its own tests below).
    own_identity = name != "security_probe"
    for headers, body in requests:
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        if own_identity:
            assert headers["authorization"] == f"Bearer {user.api_key}"
            assert headers["x-priority"] == user.priority
        assert body["max_tokens"] == 32
    for record in records:
        assert record.traffic_class == user.traffic_class
        assert record.max_tokens == 32 and record.asked_priority is not None
        assert record.tenant == user.tenant or not own_identity
        assert record.request_id in server.seen


def test_overrides_change_what_is_sent(server: FakeServer) -> None:
    user, records = make_user(
        "short_qa_interactive",
        server.url,
        api_key="kvg-globex-key",
        tenant="globex",
        priority="batch",
        model="other-model",
        ignore_eos=True,
        debug_timing=True,
    )
    run_task(user)
    ((headers, body),) = sent(server)
    assert headers["authorization"] == "Bearer kvg-globex-key"
    assert headers["x-priority"] == "batch" and headers["x-kvgate-debug-timing"] == "1"
    assert body["model"] == "other-model" and body["ignore_eos"] is True
    assert (records[0].tenant, records[0].priority) == ("globex", "batch")


def test_long_output_asks_to_ignore_eos(server: FakeServer) -> None:
    user, _ = make_user("long_output", server.url)
    run_task(user)
    ((_headers, body),) = sent(server)
    assert body["ignore_eos"] is True and body["max_tokens"] == 4096


def test_shared_prefix_sends_public_and_private_prefix_headers(server: FakeServer) -> None:
    user, records = make_user("shared_prefix", server.url, prefix_tokens=100)
    for _ in range(30):
        run_task(user)
    publics: set[str] = set()
    privates: set[str] = set()
    for headers, body in sent(server):
        assert headers["x-kvgate-prefix-tokens"] == "100"
        system = body["messages"][0]
        assert system["role"] == "system" and len(system["content"].split()) == 100
        target = publics if headers.get("x-kvgate-prefix-public") == "1" else privates
        target.add(system["content"])
    assert 1 <= len(publics) <= 2 and 1 <= len(privates) <= 2 and not publics & privates
    assert {r.target_prompt_tokens for r in records} == {116}


def test_private_prefixes_differ_between_tenants(server: FakeServer) -> None:
    contents: dict[str, set[str]] = {}
    for _ in range(3):
        user, _ = make_user("shared_prefix", server.url, prefix_tokens=20, public_share=0.0)
        for _ in range(6):
            run_task(user)
        tenant = user.tenant
        contents.setdefault(tenant, set()).update(
            body["messages"][0]["content"] for _h, body in sent(server)[-6:]
        )
    assert len(contents) == 3
    tenants = list(contents.values())
    assert not (tenants[0] & tenants[1] or tenants[0] & tenants[2] or tenants[1] & tenants[2])


def test_a_shared_prefix_class_given_a_key_sends_as_that_tenant(server: FakeServer) -> None:
    """The round robin over demo tenants is the default; a plan that names the key (one team
    per class, with its own quota) must get that key, not a demo tenant's."""
    for _ in range(3):
        named = {"api_key": "kvg-cap3-key", "api_key_name": "cap3", "tenant": "cap3"}
        user, records = make_user("shared_prefix", server.url, prefix_tokens=20, **named)
        run_task(user)
        assert user.tenant == "cap3" and records[-1].tenant == "cap3"
        headers, _ = sent(server)[-1]
        assert headers["authorization"] == "Bearer kvg-cap3-key"


def test_multi_turn_resends_earlier_turns(server: FakeServer) -> None:
    user, records = make_user("multi_turn", server.url, turns=3)
    for _ in range(4):
        run_task(user)
    bodies = [body for _h, body in sent(server)]
    assert [len(b["messages"]) for b in bodies] == [1, 3, 5, 1]  # session restarts after 3
    assert bodies[1]["messages"][:1] == bodies[0]["messages"]
    assert bodies[1]["messages"][1] == {
        "role": "assistant",
        "content": " word two words word word word",
    }
    assert [r.target_prompt_tokens for r in records] == [16, 16 + 6 + 16, 16 + 6 + 16 + 6 + 16, 16]


def test_cancel_storm_opens_a_burst_and_cancels_each_stream() -> None:
    with fake_server(tokens=50, gap_s=0.01) as srv:
        user, records = make_user("cancel_storm", srv.url, burst_size=6, cancel_after_tokens=2)
        run_task(user)
        assert srv.connections == 6  # concurrent: one connection per stream
    assert len(records) == 6
    assert all(r.outcome == "cancelled" and r.chunks == 2 and r.cancel_at for r in records)


def test_a_batch_job_runner_submits_its_items_in_chunks() -> None:
    with fake_server(tokens=20, gap_s=0.01) as srv:
        user, records = make_user("batch", srv.url, chunk_size=5)
        run_task(user)
        assert srv.connections == 5  # the chunk is in flight at once
    assert len(records) == 5 and all(r.outcome == "ok" and r.priority == "batch" for r in records)


@pytest.mark.usefixtures("fast_phase_polls")
def test_a_class_with_phases_starts_tasks_only_in_them(server: FakeServer) -> None:
    """Daytime traffic: the user waits through a trough and starts once the peak opens."""
    shape = Shape(phases=[{"name": "trough", "t0": 0.0, "t1": None}], finished=False)
    user, records = make_user("short_qa_critical", server.url, phases=("peak",))
    user.environment.shape_class = shape
    waiting = gevent.spawn(user.wait_time)
    wait_until(lambda: shape.polls >= 10, what="a few polls of the phase")
    assert not waiting.ready() and not server.requests
    shape.phases = [
        {"name": "trough", "t0": 0.0, "t1": 1.0},
        {"name": "peak", "t0": 1.0, "t1": None},
    ]
    waiting.join(timeout=10)
    assert waiting.successful() and waiting.value is not None and waiting.value >= 0
    run_task(user)
    assert len(records) == 1 and len(server.requests) == 1


@pytest.mark.usefixtures("fast_phase_polls")
def test_an_idle_phase_class_sends_nothing_after_the_shape_and_stops_when_asked(
    server: FakeServer,
) -> None:
    """A finished shape sends nothing more; the user leaves when Locust stops it, not by
    itself (a greenlet that ends itself while Locust stops users makes Locust log errors)."""
    shape = Shape(phases=[{"name": "peak", "t0": 0.0, "t1": 5.0}], finished=True)
    user, records = make_user("short_qa_critical", server.url, phases=("peak",))
    user.environment.shape_class = shape
    waiting = gevent.spawn(user.on_start)
    wait_until(lambda: shape.polls >= 10, what="a few polls of the phase")
    assert not waiting.ready()
    user._state = LOCUST_STATE_STOPPING
    waiting.join(timeout=10)
    assert isinstance(waiting.exception, StopUser)
    assert not records and not server.requests


@pytest.mark.parametrize(
    ("cls", "now", "attributes", "sleep_s", "sent"),
    [
        # every burst aligned to 20 s fires at the same wall-clock instants (103 s -> 120 s)
        ("tenant_burst", 103.0, {"burst_size": 2, "align_s": 20.0}, 17.0, 2),
        # align_delay_s puts a question 0.3 s after each 2 s tick: at 103.5 s, 0.8 s away
        ("short_qa_critical", 103.5, {"align_s": 2.0, "align_delay_s": 0.3}, 0.8, 1),
    ],
)
def test_aligned_users_wait_for_the_next_tick(
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
    cls: str,
    now: float,
    attributes: dict[str, float],
    sleep_s: float,
    sent: int,
) -> None:
    from workloads.users import traffic

    slept: list[float] = []
    # The module's clock and sleep only: every other greenlet keeps the real ones.
    monkeypatch.setattr(traffic, "time", SimpleNamespace(time=lambda: now))
    monkeypatch.setattr(traffic, "gevent", SimpleNamespace(sleep=slept.append))
    user, records = make_user(cls, server.url, **attributes)
    run_task(user)
    assert slept[0] == pytest.approx(sleep_s) and len(records) == sent


def test_an_aligned_burst_is_skipped_when_its_phase_ended_before_the_tick(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workloads.users import traffic

    shape = SimpleNamespace(phases=[{"name": "trough", "t0": 0.0, "t1": None}], finished=False)
    user, records = make_user(
        "tenant_burst", server.url, burst_size=2, align_s=20.0, phases=("trough",)
    )
    user.environment.shape_class = shape

    def tick_arrives_in_a_peak(seconds: float) -> None:
        shape.phases = [{"name": "trough", "t0": 0.0, "t1": 1.0}, {"name": "peak", "t0": 1.0}]
        shape.phases[-1]["t1"] = None

    monkeypatch.setattr(traffic, "gevent", SimpleNamespace(sleep=tick_arrives_in_a_peak))
    run_task(user)
    assert not records and not server.requests


def test_batch_backs_off_as_retry_after_asks(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(users_base, "gevent", SimpleNamespace(sleep=slept.append))
    user, records = make_user(
        "batch", server.url, extra_headers={"X-Fake": "reject"}, max_retry_sleep_s=0.2
    )
    run_task(user)
    assert records[-1].outcome == "rejected" and records[-1].retry_after_s == 3
    assert slept == [0.2]  # Retry-After: 3, capped at max_retry_sleep_s


def test_missing_host_is_a_clear_error() -> None:
    cls = subclass("NoHost", USER_CLASSES["batch"], {})
    with pytest.raises(Exception, match="no target"):
        cls(Environment(user_classes=[cls]))


def test_users_on_different_workers_send_different_prompts(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = []
    for worker_index in (0, 1, 0):
        # Each worker process counts its users from 0.
        monkeypatch.setattr(users_base, "_instances", itertools.count())
        cls = subclass("Plan_w", USER_CLASSES["short_qa_interactive"], {"prompt_tokens": 16})
        env = Environment(user_classes=[cls], host=server.url)
        # a worker runner, reduced to the one attribute the user reads
        env.runner = SimpleNamespace(worker_index=worker_index)  # type: ignore[assignment]
        prompts.append(cls(env).user_prompt(16))
    assert prompts[0] != prompts[1]
    assert prompts[0] == prompts[2]  # reproducible
