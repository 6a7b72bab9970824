"""meta.json's model (contract/runmeta.py): lenient about what a reader finds, strict about
what a writer writes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contract.runmeta import RunMeta
from gates import schema


def test_a_reader_takes_any_subset_and_keeps_the_fields_the_model_does_not_name() -> None:
    assert RunMeta.read({}).dumped() == {}
    found = {"status": "completed", "by_hand": 1, "target": {"kind": "reference", "rack": "b"}}
    assert RunMeta.read(found).dumped() == found


@pytest.mark.parametrize(
    ("fields", "part", "unnamed"),
    [
        ({"statuss": "running"}, "RunMeta", "statuss"),
        ({"target": {"kind": "vllm", "modell": "m"}}, "TargetMeta", "modell"),
        ({"records": {"written": 3, "droped": 1}}, "Records", "droped"),
        ({"phases": [{"name": "peak", "t0": 1.0, "t1": 2.0, "users": 4}]}, "Phase", "users"),
    ],
)
def test_a_writer_may_not_write_a_field_the_model_does_not_name(
    fields: dict[str, object], part: str, unnamed: str
) -> None:
    with pytest.raises(ValidationError, match=rf"{part} has no field '{unnamed}'"):
        RunMeta(**fields)


def test_a_step_ramps_knees_are_the_shapes_names_and_user_counts() -> None:
    """The capacity part takes the knees the load shape names, each a user count or None."""
    knees = {"capacity": {"slo_broken_users": 40, "capacity_users": None, "stop_reason": "knee"}}
    assert RunMeta(**knees).dumped() == knees
    with pytest.raises(ValidationError, match=r"capacity\.slo_broken_users"):
        RunMeta(capacity={"slo_broken_users": 40.5})


def test_what_is_written_is_what_was_given_and_every_run_has_the_schemas_keys() -> None:
    assert RunMeta(status="running", t_end=None).dumped() == {"status": "running", "t_end": None}
    assert set(schema.META_KEYS) <= set(RunMeta.model_fields)
