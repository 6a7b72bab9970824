"""The recipe of docs/extending.md ("A traffic class"): one module in workloads/users/ is a
traffic class. A plan names it and sets its attributes, validated by its attribute model;
the harness builds it, Locust runs it, and its records carry its traffic class, with no
other file touched.

The toy module below is written to a temporary folder added to the package's path, as if it
had been dropped into workloads/users/, and the registry is put back as shipped afterwards.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import workloads.users
from gates import schema
from gates.rundir import read_jsonl_table
from harness.loadgen import Distribution, LoadGenerator
from harness.plan import PlanError, plan_from_dict
from harness.rundir import TableWriter
from harness.sink import RecordSink
from harness.traffic import build_user_classes
from tests.workloads.fakes import fake_server
from workloads.users import USER_CLASSES, registry

TOY_MODULE = "workloads.users.toy_echo"
TOY_CLASS = '''
"""A toy traffic class, `toy_echo`: a user who asks each question `repeats` times."""

from __future__ import annotations

from typing import ClassVar

from locust import constant, task

from workloads.users.base import KvgateUser


class ToyEcho(KvgateUser):
    name = "toy_echo"
    traffic_class = "toy_echo"
    prompt_tokens, max_tokens = 8, 4
    repeats: ClassVar[int] = 2  # its own attribute: a plan may set it
    wait_time = constant(0.05)

    @task
    def ask_again(self) -> None:
        for _ in range(self.repeats):
            self.send_prompt()
'''


def toy_plan(**toy_attributes: object) -> dict[str, object]:
    return {
        "name": "toy",
        "seed": 3,
        "traffic": {
            "classes": {
                "toy_echo": {"attributes": toy_attributes},
                "toy_slow": {"base": "toy_echo", "attributes": {"wait_time": [0.1, 0.2]}},
            },
            "stop_timeout_s": 5,
        },
        "load": {"users": 2, "spawn_rate": 100, "duration_s": 2, "idle_before_s": 0},
    }


@pytest.fixture
def drop_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Writes the toy module into a folder on workloads.users' path and discovers it; the
    registry and the module are taken out again when the test ends."""
    before = dict(registry._classes)
    folder = tmp_path / "users"
    folder.mkdir()
    monkeypatch.setattr(workloads.users, "__path__", [*workloads.users.__path__, str(folder)])

    def write_and_discover() -> None:
        (folder / "toy_echo.py").write_text(TOY_CLASS)
        workloads.users.discover()

    yield write_and_discover
    registry._classes.clear()
    registry._classes.update(before)
    sys.modules.pop(TOY_MODULE, None)


def test_a_class_in_one_module_is_planned_validated_run_and_recorded(
    drop_in: Callable[[], None], tmp_path: Path
) -> None:
    with pytest.raises(PlanError, match=r"toy_slow\.base: 'toy_echo' is not a traffic class"):
        plan_from_dict(toy_plan())
    drop_in()
    assert USER_CLASSES["toy_echo"].__module__ == TOY_MODULE
    # its attribute model is its annotations: `repeats` is an int
    with pytest.raises(PlanError) as err:
        plan_from_dict(toy_plan(repeats="twice"))
    assert (
        "traffic.classes.toy_echo.attributes.repeats: Input should be a valid integer "
        "(the attribute is int) (got 'twice')"
    ) in str(err.value)
    plan = plan_from_dict(toy_plan(repeats=3))

    with fake_server(tokens=2) as server:
        echo, slow = build_user_classes(plan, server.url)
        assert (echo.__name__, slow.__name__) == ("toy_echo", "toy_slow")
        # the toy classes are written at run time: no type declares `repeats`
        assert echo.repeats == 3 and slow.repeats == 2  # type: ignore[attr-defined]
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        writer = TableWriter(run_dir, schema.REQUESTS)
        sink = RecordSink(writer)
        loadgen = LoadGenerator(plan, [echo, slow], None, server.url, sink, Distribution())
        try:
            loadgen.run_load(plan.load.duration_s)
        finally:
            loadgen.close()
            writer.close()
        seen = set(server.seen)
    rows = read_jsonl_table(run_dir / f"{schema.REQUESTS}.jsonl", schema.REQUESTS).frame
    assert seen <= set(rows["request_id"]) and sink.by_class == {"toy_echo": len(rows)}
    assert set(rows["traffic_class"]) == {"toy_echo"}
    answered = rows["outcome"].eq("ok")
    assert answered.sum() >= 4  # the only others: requests the load's stop cut short
    assert rows["error_code"][~answered].eq("user_stopped").all()
