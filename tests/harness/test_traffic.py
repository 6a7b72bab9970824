"""Plans become Locust classes: overrides, aliases, shapes, and errors for unknown attributes."""

from __future__ import annotations

from pathlib import Path

import pytest
from locust import User
from locust.env import Environment

from harness.plan import Plan, PlanError, load_plan, plan_from_dict
from harness.traffic import TrafficError, build_shape, build_user_classes
from tests.built_users import built_user_classes
from workloads.shapes import PeakTroughShape, SoakShape, StepRampShape

PLANS = Path(__file__).resolve().parents[2] / "harness" / "plans"


def plan_with(classes: dict[str, object], **extra: object) -> Plan:
    return plan_from_dict({"name": "t", "seed": 5, "traffic": {"classes": classes}, **extra})


def test_overrides_host_seed_and_wait_time_reach_the_classes() -> None:
    plan = plan_with(
        {
            "batch": {"weight": 2, "attributes": {"max_tokens": 7, "wait_time": [1, 2]}},
            "lc_acme": {"base": "long_context", "fixed_count": 1, "attributes": {"tenant": "acme"}},
        }
    )
    batch, lc = built_user_classes(plan, "http://127.0.0.1:9")
    assert batch.__name__ == "batch" and lc.__name__ == "lc_acme"
    assert batch.host == "http://127.0.0.1:9" and batch.weight == 2 and batch.max_tokens == 7
    assert batch.seed == 5 and 1 <= batch.wait_time(User(Environment())) <= 2
    assert lc.tenant == "acme" and lc.fixed_count == 1 and lc.traffic_class == "long_context"


def test_unknown_attribute_lists_the_known_ones() -> None:
    with pytest.raises(
        PlanError,
        match=r"traffic\.classes\.batch\.attributes\.max_tokenz: batch has no such attribute; "
        r"known: .*max_tokens",
    ):
        plan_with({"batch": {"attributes": {"max_tokenz": 3}}})


def test_shapes_get_their_attributes_and_reject_unknown_ones() -> None:
    plan = plan_with({"batch": {}}, load={"shape": "soak", "shape_attributes": {"users": 3}})
    shape = build_shape(plan)
    assert isinstance(shape, SoakShape) and shape.users == 3
    bad = plan_with({"batch": {}}, load={"shape": "soak", "shape_attributes": {"userz": 3}})
    with pytest.raises(TrafficError, match=r"load\.shape_attributes"):
        build_shape(bad)


@pytest.mark.parametrize("name", ["smoke", "ci", "soak", "capacity"])
def test_shipped_plans_build_against_the_workloads(name: str) -> None:
    plan = load_plan(PLANS / f"{name}.yaml")
    classes = build_user_classes(plan, "http://127.0.0.1:9")
    assert len(classes) == len(plan.traffic.classes)
    assert (build_shape(plan) is None) == (plan.load.shape == "constant")
    assert plan.planned_seconds() <= {"smoke": 60, "ci": 240}.get(name, 4000)


def test_a_shape_that_runs_until_decided_is_as_long_as_the_maximum_allows() -> None:
    """The ci plan run until decided as README.md's recipe runs it, at most 360 s: as many
    whole 90 s cycles as fit (its own `cycles: 2` is replaced); a soak holds until the
    maximum less its cooldown; a ramp stops at the maximum at the latest."""
    recipe = ["load.until=decided", "load.min_duration_s=180", "load.max_duration_s=360"]
    shape = build_shape(load_plan(PLANS / "ci.yaml", recipe))
    assert isinstance(shape, PeakTroughShape) and shape.cycles == 4
    # the first stop is the end of the planned second cycle, with every fault fired by then
    assert shape.end_at_boundary(not_before_s=180) == 180
    shipped = build_shape(load_plan(PLANS / "ci.yaml"))
    assert isinstance(shipped, PeakTroughShape) and shipped.cycles == 2
    attrs = {"duration_s": 3540, "cooldown_s": 20}
    soak = plan_with(
        {"batch": {}},
        load={"shape": "soak", "shape_attributes": attrs, "until": "decided", "duration_s": 600},
    )
    assert isinstance(soak_shape := build_shape(soak), SoakShape)
    assert soak_shape.duration_s == 580
    ramp = load_plan(PLANS / "capacity.yaml", ["load.until=decided", "load.max_duration_s=300"])
    assert isinstance(ramp_shape := build_shape(ramp), StepRampShape)
    assert ramp_shape.max_duration_s == 300


def test_a_maximum_shorter_than_one_cycle_is_refused_with_what_to_change() -> None:
    ci = load_plan(
        PLANS / "ci.yaml",
        ["load.until=decided", "load.max_duration_s=60", "load.min_duration_s=30", "faults=[]"],
    )
    with pytest.raises(TrafficError, match=r"max_duration_s \(60 s\) holds no whole peak/trough"):
        build_shape(ci)
