"""The target's request dialect: built once from its profile and the plan, set on every class."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from harness.plan import Plan, PlanError, plan_from_dict
from harness.traffic import TrafficError, build_user_classes, target_dialect
from tests.built_users import built_user_classes
from workloads.dialect import Dialect

URL = "http://127.0.0.1:9"


def plan(target: dict[str, Any], classes: dict[str, Any]) -> Plan:
    return plan_from_dict(
        {"name": "t", "seed": 5, "target": target, "traffic": {"classes": classes}}
    )


def external(kind: str, **extra: Any) -> dict[str, Any]:
    return {"type": "external", "url": URL, "kind": kind, "model": "m", **extra}


def test_each_target_kind_gets_its_profiles_dialect() -> None:
    reference = target_dialect(plan({"type": "reference"}, {"batch": {}}))
    assert reference == Dialect(
        priority_header=True,
        priority_values=None,
        cache_salt=False,
        min_tokens=True,
        ignore_eos=True,
        continuous_usage_stats=False,
    )
    vllm = target_dialect(plan(external("vllm"), {"batch": {}}))
    assert vllm == Dialect(
        priority_header=False,
        priority_values={"critical": 0, "interactive": 1, "batch": 2},
        cache_salt=True,
        min_tokens=True,
        ignore_eos=True,
        continuous_usage_stats=True,
    )
    assert target_dialect(plan({"type": "vllm"}, {"batch": {}})) == vllm
    openai = target_dialect(plan(external("openai"), {"batch": {}}))
    assert not openai.carries_priority and not openai.ignore_eos and not openai.cache_salt


def test_a_plan_switches_an_extension_off_for_its_target() -> None:
    unsalted = target_dialect(
        plan(external("vllm", extensions={"cache_salt": False}), {"batch": {}})
    )
    assert not unsalted.cache_salt and unsalted.priority_values is not None
    no_field = target_dialect(
        plan(external("vllm", extensions={"priority_field": False}), {"batch": {}})
    )
    assert no_field.priority_values is None and not no_field.carries_priority


def test_every_built_class_carries_the_targets_dialect() -> None:
    p = plan(external("sglang"), {"batch": {}, "long_output": {}, "security_probe": {}})
    dialect = target_dialect(p)
    assert all(cls.dialect == dialect for cls in built_user_classes(p, URL))


def test_what_a_class_asks_for_and_the_target_will_not_take_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    classes = {"long_output": {"attributes": {"max_tokens": 300}}, "security_probe": {}}
    with caplog.at_level(logging.WARNING, logger="harness.traffic"):
        (long_output, _probe) = built_user_classes(plan(external("tgi"), classes), URL)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "traffic.classes.long_output: ignore_eos is not sent to this tgi server "
        "(contract/profiles/tgi.yaml); its outputs end where the model stops",
        "traffic.classes.long_output: min_tokens is not sent to this tgi server "
        "(contract/profiles/tgi.yaml); its outputs may end before min_tokens",
        "traffic.classes.security_probe: this tgi server takes no priority "
        "(contract/profiles/tgi.yaml); its escalation probes ask for none",
    ]
    # What the class asks stays as asked; the dialect decides what goes out.
    assert long_output.ignore_eos and long_output.min_tokens == 300
    assert not long_output.dialect.ignore_eos


def test_an_extension_the_plan_switched_off_is_blamed_on_the_plan(
    caplog: pytest.LogCaptureFixture,
) -> None:
    target = external("vllm", extensions={"ignore_eos": False})
    with caplog.at_level(logging.WARNING, logger="harness.traffic"):
        build_user_classes(plan(target, {"long_output": {}}), URL)
    (said,) = [r.getMessage() for r in caplog.records]
    assert "ignore_eos is not sent to this vllm server (target.extensions)" in said


def test_nothing_is_said_where_the_target_takes_everything_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="harness.traffic"):
        build_user_classes(plan(external("vllm"), {"long_output": {}, "security_probe": {}}), URL)
        build_user_classes(plan({"type": "reference"}, {"long_output": {}}), URL)
    assert not caplog.records


def test_a_class_cannot_set_its_own_dialect() -> None:
    with pytest.raises(PlanError, match=r"batch\.attributes\.dialect: the target decides"):
        plan({"type": "reference"}, {"batch": {"attributes": {"dialect": {}}}})


@pytest.mark.parametrize(
    "attributes",
    [
        {"priority": "urgent"},
        {"escalations": [["kvg-nightly-key", "nightly-demo", "nightly", "urgent"]]},
    ],
)
def test_a_priority_no_stage_knows_is_a_plan_error(attributes: dict[str, Any]) -> None:
    p = plan({"type": "reference"}, {"security_probe": {"attributes": attributes}})
    with pytest.raises(TrafficError, match=r"security_probe: priority urgent is not one of"):
        build_user_classes(p, URL)
