"""The traffic-class registry: classes register by naming themselves, the contract's record
values are what the shipped classes record, and each class's attribute model is read from
its annotations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from locust import task
from pydantic import ValidationError

import contract
from workloads.users import USER_CLASSES, KvgateUser, registry
from workloads.users.traffic import LongOutput, ShortQACritical


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    """Classes a test defines leave the registry again when it ends."""
    before = dict(registry._classes)
    yield
    registry._classes.clear()
    registry._classes.update(before)


def test_the_shipped_classes_record_exactly_the_contracts_traffic_classes() -> None:
    # The one tie between the registry and the run-directory contract: a shipped class that
    # records a value the contract lacks, or a contract value no class records, fails here.
    shipped = {n: c for n, c in USER_CLASSES.items() if c.__module__.startswith("workloads.")}
    assert set(shipped) == set(USER_CLASSES)  # nothing else registered at import
    assert {c.traffic_class for c in shipped.values()} == set(contract.TRAFFIC_CLASSES)
    assert list(USER_CLASSES)[:2] == ["short_qa_critical", "short_qa_interactive"]
    assert all(c.name == name and c.label == name for name, c in USER_CLASSES.items())


def test_a_class_that_names_itself_registers_and_one_built_from_it_does_not(
    scratch_registry: None,
) -> None:
    class Echo(KvgateUser):
        name = "echo_test"
        traffic_class = "short_qa"

        @task
        def ask(self) -> None:
            self.send_prompt()

    assert USER_CLASSES["echo_test"] is Echo and Echo.label == "echo_test"
    built = type("echo_for_acme", (Echo,), {"tenant": "acme"})
    assert issubclass(built, Echo) and built.name == "echo_test"
    assert "echo_for_acme" not in USER_CLASSES
    assert USER_CLASSES["short_qa_interactive"].traffic_class == "short_qa"  # inherited


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "short_qa_critical", "traffic_class": "short_qa"}, "is already workloads"),
        ({"name": "echo-test", "traffic_class": "short_qa"}, "is not a plan key"),
        ({"name": "echo_test"}, "set traffic_class"),
        ({"name": "echo_test", "traffic_class": "x", "abstract": True}, "cannot be abstract"),
    ],
)
def test_a_class_that_cannot_register_is_refused_as_it_is_defined(
    scratch_registry: None, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        type("Bad", (KvgateUser,), body)
    assert "echo_test" not in USER_CLASSES and "echo-test" not in USER_CLASSES
    assert USER_CLASSES["short_qa_critical"] is ShortQACritical


def test_the_attribute_model_is_the_annotations_down_to_the_class() -> None:
    types = registry.attribute_types(USER_CLASSES["cancel_storm"])
    assert types["burst_size"] is int and types["max_tokens"] == int | None
    assert types["phases"] == tuple[str, ...]
    assert "align_s" not in types  # another class's attribute
    assert "dialect" not in types and "name" not in types  # not a plan's to set
    assert "send" not in types and "weight" not in types  # methods, Locust's own


def test_configure_validates_as_yaml_wrote_it_and_converts() -> None:
    attrs = registry.configure(
        USER_CLASSES["security_probe"],
        {
            "escalations": [["k", "kn", "t", "critical"]],
            "timeout_s": 30,
            "wait_time": [1, 2],
        },
    )
    assert attrs["escalations"] == (("k", "kn", "t", "critical"),) and attrs["timeout_s"] == 30.0
    assert 1 <= attrs["wait_time"](None) <= 2
    assert registry.configure(LongOutput, {"wait_time": 3})["wait_time"](None) == 3
    with pytest.raises(ValidationError) as err:
        registry.configure(
            USER_CLASSES["batch"],
            {"chunk_size": "3", "ignore_eos": 1, "wait_time": "soon", "dialect": {}},
        )
    problems = {".".join(map(str, e["loc"])): e["msg"] for e in err.value.errors()}
    assert problems["chunk_size"] == "Input should be a valid integer (the attribute is int)"
    assert problems["ignore_eos"].startswith("Input should be a valid boolean")
    assert problems["wait_time"] == "give seconds (2) or a range ([0.5, 2])"
    assert problems["dialect"].startswith("the target decides what requests carry")


def test_an_attribute_a_subclass_declares_is_one_a_plan_may_set(scratch_registry: None) -> None:
    class Echo(KvgateUser):
        name = "echo_test"
        traffic_class = "short_qa"
        repeats: ClassVar[int] = 2

    assert registry.configure(Echo, {"repeats": 5}) == {"repeats": 5}
    assert registry.attribute_errors(Echo, {"repeats": 2.5}, ("at",))[0]["loc"] == (
        "at",
        "repeats",
    )
