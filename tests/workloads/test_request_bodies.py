"""What each kind of target is sent: the exact JSON body and priority headers per profile.

Classes are built from a plan, as a run builds them (harness.traffic), and each user's
requests are captured where they would go on the wire (the client's `stream`), so these are
the bytes a server would read.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from locust import User
from locust.env import Environment

from contract import Outcome, RequestRecord
from harness.plan import plan_from_dict
from harness.traffic import build_user_classes
from tests.classes import subclass
from workloads.records import install_record_hook
from workloads.request import StreamRequest, StreamResult

URL = "http://127.0.0.1:9"
USAGE = {"include_usage": True}
EVERY_CHUNK = {"include_usage": True, "continuous_usage_stats": True}
# One class of each kind the table below covers, as a plan would give them.
CLASSES: dict[str, Any] = {
    "short_qa_critical": {"attributes": {"max_tokens": 32}},
    "batch": {},
    "long_output": {"attributes": {"max_tokens": 512}},  # min_tokens follows it
    "public_prefix": {
        "base": "shared_prefix",
        "attributes": {"public_share": 1.0, "prefix_tokens": 16},
    },
    "private_prefix": {
        "base": "shared_prefix",
        "attributes": {
            "public_share": 0.0,
            "prefix_tokens": 16,
            "api_key": "kvg-acme-key",
            "tenant": "acme",
        },
    },
    "security_probe": {
        "attributes": {
            "escalations": [["kvg-nightly-key", "nightly-demo", "nightly", "critical"]],
            "prefix_tokens": 16,
            "send_priority_header": False,  # the probe asks all the same
        }
    },
}
TARGETS: dict[str, dict[str, Any]] = {
    "reference": {"type": "reference"},
    "vllm": {"type": "external", "url": URL, "kind": "vllm", "model": "m"},
    "vllm_unsalted": {
        "type": "external",
        "url": URL,
        "kind": "vllm",
        "model": "m",
        "extensions": {"cache_salt": False},
    },
    "vllm_managed": {"type": "vllm"},
    "sglang": {"type": "external", "url": URL, "kind": "sglang", "model": "m"},
    "tgi": {"type": "external", "url": URL, "kind": "tgi", "model": "m"},
    "openai": {"type": "external", "url": URL, "kind": "openai", "model": "m"},
}
MODELS = {"reference": "llama-3-8b", "vllm_managed": "tiny-llama"}
SCENARIOS = (
    "critical",
    "batch",
    "long_output",
    "public_prefix",
    "private_prefix",
    "escalation",
    "prefix_warm",
    "prefix_probe",
)


def body(max_tokens: int, stream_options: dict[str, bool] = USAGE, **extra: Any) -> dict[str, Any]:
    """The whole body but `model` and `messages` (prompts vary), in the order sent."""
    return {"stream": True, "stream_options": stream_options, "max_tokens": max_tokens, **extra}


def salt(tenant: str) -> dict[str, str]:
    return {"cache_salt": f"kvgate-tenant:{tenant}"}


def vllm(salted: bool) -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    def s(tenant: str) -> dict[str, str]:
        return salt(tenant) if salted else {}

    return {
        "critical": (body(32, EVERY_CHUNK, priority=0, **s("system")), {}),
        "batch": (body(256, EVERY_CHUNK, priority=2, **s("batchco")), {}),
        "long_output": (
            body(512, EVERY_CHUNK, min_tokens=512, ignore_eos=True, priority=1, **s("initech")),
            {},
        ),
        "public_prefix": (body(64, EVERY_CHUNK, priority=1), {}),  # public: never salted
        "private_prefix": (body(64, EVERY_CHUNK, priority=1, **s("acme")), {}),
        "escalation": (body(8, EVERY_CHUNK, priority=0, **s("nightly")), {}),
        "prefix_warm": (body(8, EVERY_CHUNK, priority=1, **s("acme")), {}),
        "prefix_probe": (body(8, EVERY_CHUNK, priority=1, **s("globex")), {}),
    }


def plain(ignore_eos: bool) -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    long = {"min_tokens": 512, "ignore_eos": True} if ignore_eos else {}
    return {
        "critical": (body(32), {}),
        "batch": (body(256), {}),
        "long_output": (body(512, USAGE, **long), {}),
        "public_prefix": (body(64), {}),
        "private_prefix": (body(64), {}),
        "escalation": (body(8), {}),
        "prefix_warm": (body(8), {}),
        "prefix_probe": (body(8), {}),
    }


# target -> scenario -> (body without model and messages, priority headers)
EXPECTED: dict[str, dict[str, tuple[dict[str, Any], dict[str, str]]]] = {
    # the reference server honours continuous usage, but its profile leaves it off
    "reference": {
        "critical": (body(32), {"x-priority": "critical"}),
        "batch": (body(256), {"x-priority": "batch"}),
        "long_output": (
            body(512, min_tokens=512, ignore_eos=True),
            {"x-priority": "interactive"},
        ),
        "public_prefix": (body(64), {"x-priority": "interactive"}),
        "private_prefix": (body(64), {"x-priority": "interactive"}),
        "escalation": (body(8), {"x-priority": "critical"}),
        # the plan turned priority headers off: only the escalation insists
        "prefix_warm": (body(8), {}),
        "prefix_probe": (body(8), {}),
    },
    "vllm": vllm(salted=True),
    "vllm_unsalted": vllm(salted=False),
    "vllm_managed": vllm(salted=True),
    "sglang": plain(ignore_eos=True),
    "tgi": plain(ignore_eos=False),
    "openai": plain(ignore_eos=False),
}


class Recorder:
    """Stands in for the streaming client: keeps each request and ends it `ok`."""

    def __init__(self) -> None:
        self.sent: list[StreamRequest] = []

    def stream(self, request: StreamRequest, result: StreamResult) -> None:
        self.sent.append(request)
        result.outcome = Outcome.OK

    def close(self) -> None:
        pass


def capture(target: str) -> dict[str, tuple[StreamRequest, RequestRecord]]:
    """Runs one task of each class against `target`; each scenario's request and record."""
    plan = plan_from_dict(
        {"name": "t", "seed": 5, "target": TARGETS[target], "traffic": {"classes": CLASSES}}
    )
    got: dict[str, tuple[StreamRequest, RequestRecord]] = {}
    for cls in build_user_classes(plan, URL):
        requests, records = run_one_task(cls)
        if cls.__name__ == "security_probe":
            by_probe = {r.probe: (q, r) for q, r in zip(requests, records, strict=True)}
            got["escalation"] = by_probe["escalation"]
            got["prefix_warm"] = by_probe["prefix_warm"]
            got["prefix_probe"] = by_probe["prefix_probe"]
            got["prefix_control"] = by_probe["prefix_control"]
        else:
            name = {"short_qa_critical": "critical"}.get(cls.__name__, cls.__name__)
            ((request, record),) = zip(requests, records, strict=True)
            got[name] = (request, record)
    return got


def run_one_task(cls: type[User]) -> tuple[list[StreamRequest], list[RequestRecord]]:
    env = Environment(user_classes=[cls], host=URL)
    records: list[RequestRecord] = []
    install_record_hook(env).add_listener(lambda record, **_kw: records.append(record))
    user = cls(env)
    recorder = Recorder()
    user.client = recorder  # type: ignore[attr-defined]  # captures what would be sent
    user.on_start()
    (task,) = user.tasks
    assert callable(task)  # Locust types tasks as TaskSet instances; ours are functions
    task(user)
    return recorder.sent, records


def priority_headers(request: StreamRequest) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items() if k.lower() == "x-priority"}


@pytest.fixture(scope="module", params=sorted(TARGETS))
def sent(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, capture(request.param)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_target_gets_exactly_the_extensions_its_profile_takes(
    sent: tuple[str, dict[str, tuple[StreamRequest, RequestRecord]]], scenario: str
) -> None:
    target, by_scenario = sent
    request, _record = by_scenario[scenario]
    wire = json.loads(request.body)
    assert list(wire)[:2] == ["model", "messages"]
    assert wire.pop("model") == MODELS.get(target, "m")
    roles = [m["role"] for m in wire.pop("messages")]
    assert roles == (["system", "user"] if "prefix" in scenario else ["user"])
    want_body, want_headers = EXPECTED[target][scenario]
    assert wire == want_body
    assert list(wire) == list(want_body)  # the order too: the bytes are reproducible
    assert priority_headers(request) == want_headers


def test_the_full_body_of_a_critical_question_to_vllm() -> None:
    """One literal body, end to end, as vLLM reads it."""
    request, record = capture("vllm")["critical"]
    wire = json.loads(request.body)
    assert wire == {
        "model": "m",
        "messages": wire["messages"],
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": 32,
        "priority": 0,
        "cache_salt": "kvgate-tenant:system",
    }
    assert "X-Priority" not in request.headers and record.asked_priority == "critical"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_public_prefixes_are_marked_public_and_private_ones_are_not(target: str) -> None:
    got = capture(target)
    public = got["public_prefix"][0].headers
    assert public["X-Kvgate-Prefix-Public"] == "1" and public["X-Kvgate-Prefix-Tokens"] == "16"
    for scenario in ("private_prefix", "prefix_warm", "prefix_probe", "prefix_control"):
        assert "X-Kvgate-Prefix-Public" not in got[scenario][0].headers


@pytest.mark.parametrize(
    ("target", "asked"),
    [
        ("reference", "critical"),  # X-Priority
        ("vllm", "critical"),  # the body's priority
        ("sglang", None),  # neither: nothing was asked
        ("openai", None),
    ],
)
def test_an_escalation_records_the_priority_it_asked_through_the_target(
    target: str, asked: str | None
) -> None:
    _request, record = capture(target)["escalation"]
    assert (record.tenant, record.priority, record.asked_priority) == (
        "nightly",
        "critical",
        asked,
    )


def test_the_prefix_probe_is_salted_as_its_prober_and_its_warm_up_as_the_owner() -> None:
    """What makes private_prefix_isolation pass on a vLLM that honours the salt: the probe
    cannot find the owner's blocks. Without the salt (a gateway that forgets it), it can."""
    got = capture("vllm")
    salts = {k: json.loads(got[k][0].body).get("cache_salt") for k in got}
    assert salts["prefix_warm"] == "kvgate-tenant:acme"
    assert salts["prefix_probe"] == salts["prefix_control"] == "kvgate-tenant:globex"
    unsalted = capture("vllm_unsalted")
    assert all("cache_salt" not in json.loads(q.body) for q, _r in unsalted.values())


def test_min_tokens_follows_a_plan_that_changes_long_output_max_tokens() -> None:
    from workloads.users import USER_CLASSES

    long_output = USER_CLASSES["long_output"]
    assert long_output.min_tokens == long_output.max_tokens == 4096
    capped = subclass("lo", long_output, {"max_tokens": 300})
    own = subclass("lo2", long_output, {"max_tokens": 300, "min_tokens": 100})
    assert capped.min_tokens == 300 and own.min_tokens == 100


def test_a_request_expects_content_unless_it_asks_for_no_output() -> None:
    """An empty stream is an error only for a request that asked for output: the client
    learns which from the max_tokens its body carries."""
    from workloads.users import USER_CLASSES

    assert all(request.expects_content for request, _record in capture("reference").values())
    cls = subclass("no_output", USER_CLASSES["batch"], {"max_tokens": 0})
    user = cls(Environment(user_classes=[cls], host=URL))
    who = user.caller()
    assert not user.build_request([], "r0", who).expects_content
    assert user.build_request([], "r1", who, max_tokens=4).expects_content
