"""`load.until: decided`: the stop rule on made-up looks, with a fake shape and no clock of
its own (the elapsed seconds are arguments), and its record in meta.json."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console

from contract.runmeta import RunMeta
from gates import schema
from gates.spec import GateSpec
from harness.live.console import Progress
from harness.live.until import UntilDecided
from harness.loadgen import Distribution
from harness.orchestrator import Orchestrator
from harness.plan import plan_from_dict
from harness.rundir import TableWriter
from harness.sink import RecordSink


def gate(gate_id: str, key: bool = True, blocks: str | bool = False) -> GateSpec:
    return GateSpec.model_validate(
        {"id": gate_id, "title": gate_id, "metric": "availability", "pass": "rate >= 0.9",
         "key": key, "blocks": blocks}
    )  # fmt: skip


GATES = [gate("served"), gate("no_oom"), gate("speed", key=False)]
# with a gate that blocks without being key (preemptions that must complete, say)
BLOCKING = [*GATES, gate("completes", key=False, blocks="lost work")]


def result(gate_id: str, decision: str, settled: bool, n: int = 100, **more: Any) -> dict[str, Any]:
    return {"id": gate_id, "decision": decision, "settled": settled, "n": n, **more}


class FakeShape:
    """A shape with boundaries every `every_s` seconds, on the test's clock (`now`)."""

    def __init__(self, every_s: float, confirms: bool = True) -> None:
        self.every_s = every_s
        self.confirms_at_boundary = confirms
        self.now = 0.0
        self.end_at_s: float | None = None
        self.asked: list[float] = []
        self.resumed_at: list[float] = []

    @property
    def parked(self) -> bool:
        return self.end_at_s is not None and self.now >= self.end_at_s

    def end_at_boundary(self, not_before_s: float = 0.0) -> float:
        self.asked.append(not_before_s)
        if self.end_at_s is None:
            boundary = (self.now // self.every_s + 1) * self.every_s
            self.end_at_s = max(boundary, -(-not_before_s // self.every_s) * self.every_s)
        return self.end_at_s

    def resume(self) -> None:
        self.resumed_at.append(self.now)
        self.end_at_s = None


def test_it_stops_when_every_key_gate_is_settled_at_one_look_begun_after_the_minimum() -> None:
    rule = UntilDecided(GATES, min_s=20, max_s=120)
    assert rule.key == ["served", "no_oom"]  # a gate that is not key never holds the load
    assert rule.tick(5) is None
    rule.look(10, [result("served", "PASS", True), result("no_oom", "UNDECIDED", False)])
    assert rule.tick(12) is None and rule.decided_at_s is None
    # a look begun before the minimum decides no PASS: a fault before it may be missing
    rule.look(18, [result("served", "PASS", True), result("no_oom", "UNDECIDED", True)], 15)
    assert rule.tick(21) is None and rule.decided_at_s is None
    # settled at different looks is not one decision: served is undecided again here
    rule.look(26, [result("served", "UNDECIDED", False), result("no_oom", "UNDECIDED", True)], 22)
    assert rule.tick(27) is None
    rule.look(34, [result("served", "PASS", True), result("no_oom", "UNDECIDED", True)], 30)
    assert rule.decided_at_s == 34
    reason = rule.tick(34.2)
    assert reason == "every key and blocking gate decided at +34 s (load.until: decided)"
    # a later look does not undo the decision; the rule only shows it
    rule.look(44, [result("served", "UNDECIDED", False), result("no_oom", "FAIL", True)], 40)
    assert rule.tick(45) == reason and rule.decided_at_s == 34


def test_a_look_without_every_key_gate_decides_nothing() -> None:
    rule = UntilDecided(GATES, min_s=0, max_s=60)
    rule.look(10, [result("served", "PASS", True), result("speed", "PASS", True)])
    assert rule.tick(11) is None and rule.decided_at_s is None


def test_a_key_gate_decided_fail_stops_the_load_without_waiting_for_a_boundary() -> None:
    shape = FakeShape(every_s=90)
    rule = UntilDecided(GATES, min_s=20, max_s=300, shape=shape)
    rule.look(10, [result("served", "FAIL", True), result("no_oom", "UNDECIDED", False)])
    assert rule.tick(15) is None  # not before the minimum: the faults all fire by then
    shape.now = 20
    assert rule.tick(20) == "key gate served decided FAIL at +10 s (load.until: decided)"
    assert shape.asked == []  # a FAIL does not wait for the end of the cycle


def test_a_blocking_gate_holds_the_load_once_it_has_data_until_it_is_settled() -> None:
    """A blocking gate that lacks its samples makes the verdict MARGINAL, so it holds the
    load like a key gate; one the load never provoked (n 0) is left to its missing-data rule
    and holds nothing."""
    rule = UntilDecided(BLOCKING, min_s=0, max_s=300)
    assert rule.key == ["served", "no_oom"] and rule.held == ["served", "no_oom", "completes"]
    keys = [result("served", "PASS", True), result("no_oom", "UNDECIDED", True)]
    rule.look(10, [*keys, result("completes", "UNDECIDED", False, n=0)])
    assert rule.decided_at_s == 10  # nothing preempted yet: it holds nothing
    rule = UntilDecided(BLOCKING, min_s=0, max_s=300)
    rule.look(10, [*keys, result("completes", "UNDECIDED", False, n=373, needs_n=607)])
    assert rule.tick(11) is None and rule.decided_at_s is None
    assert rule.label() == "2/3 settled; waiting: completes n=373/607"
    assert [g["key"] for g in rule.record()["gates"]] == [True, True, False]
    rule.look(20, [*keys, result("completes", "PASS", True, n=650)])
    assert rule.tick(21) == "every key and blocking gate decided at +20 s (load.until: decided)"


def test_a_blocking_gate_decided_fail_stops_the_load_as_a_key_gate_does() -> None:
    rule = UntilDecided(BLOCKING, min_s=20, max_s=300)
    keys = [result("served", "UNDECIDED", False), result("no_oom", "UNDECIDED", True)]
    rule.look(10, [*keys, result("completes", "FAIL", True, n=40)])
    assert rule.tick(15) is None
    assert rule.tick(20) == "blocking gate completes decided FAIL at +10 s (load.until: decided)"


def settled_look(rule: UntilDecided, at_s: float, began_s: float, served: bool = True) -> None:
    rule.look(
        at_s,
        [result("served", "PASS" if served else "UNDECIDED", served),
         result("no_oom", "UNDECIDED", True)],
        began_s,
    )  # fmt: skip


def test_a_shape_with_phases_stops_at_a_boundary_on_the_look_taken_there() -> None:
    """A look that settles the load asks the shape to end at the first cycle end not before
    the minimum; the shape holds there, a look begun there decides, and the load stops."""
    shape = FakeShape(every_s=90)
    rule = UntilDecided(GATES, min_s=100, max_s=400, shape=shape)
    shape.now = 60
    settled_look(rule, 60, began_s=55)
    assert rule.tick(60) is None
    assert shape.asked == [100] and shape.end_at_s == 180  # the first cycle end after 100 s
    assert rule.label() == "2/2 settled; ends at the boundary at +180 s if still settled"
    for now in (150.0, 179.5):
        shape.now = now
        assert rule.tick(now) is None and not rule.wants_look  # the cycle runs to its end
    shape.now = 180.5
    assert rule.tick(180.5) is None and rule.wants_look  # held at the boundary: look now
    assert rule.label() == "2/2 settled; holding at the boundary for the look that decides"
    settled_look(rule, 183, began_s=176)  # begun before the boundary: it decides nothing
    assert rule.tick(183) is None and rule.wants_look
    settled_look(rule, 188, began_s=181)
    assert rule.tick(188) == (
        "every key and blocking gate decided at the boundary at +188 s (load.until: decided)"
    )
    assert not shape.resumed_at and rule.decided_at_s == 188


def test_undecided_at_the_boundary_the_shape_goes_on_a_whole_cycle() -> None:
    shape = FakeShape(every_s=90)
    rule = UntilDecided(GATES, min_s=0, max_s=400, shape=shape)
    shape.now = 70
    settled_look(rule, 70, began_s=65)
    assert rule.tick(70) is None and shape.end_at_s == 90
    shape.now = 91
    rule.tick(91)
    settled_look(rule, 95, began_s=91, served=False)  # the look at the boundary: not yet
    assert shape.resumed_at == [91] and rule.resumed == 1 and not rule.wants_look
    assert rule.tick(96) is None and shape.end_at_s is None  # nothing asked until a look says
    shape.now = 150
    settled_look(rule, 150, began_s=145)
    assert rule.tick(150) is None and shape.end_at_s == 180
    shape.now = 181
    rule.tick(181)
    settled_look(rule, 186, began_s=182)
    assert rule.tick(186) is not None and rule.record()["resumed"] == 1


def test_settled_with_the_boundary_at_the_maximum_the_record_says_decided() -> None:
    """The look settles the load, and the next cycle end is the maximum itself: the deadline
    stops the load there before a look can confirm. The record says the gates were decided
    at the last look, not that they were undecided."""
    shape = FakeShape(every_s=90)
    rule = UntilDecided(GATES, min_s=180, max_s=270, shape=shape)
    shape.now = 200
    settled_look(rule, 200, began_s=195)
    assert rule.tick(200) is None and shape.end_at_s == 270
    rule.stopped(270.0, None)
    record = rule.record()
    assert record["decided"] and record["decided_at_s"] == 200
    assert record["stopped_because"].startswith("every key and blocking gate decided at its")
    unsettled = UntilDecided(GATES, min_s=180, max_s=270, shape=FakeShape(every_s=90))
    settled_look(unsettled, 200, began_s=195, served=False)
    unsettled.stopped(270.0, None)
    assert unsettled.record()["stopped_because"] == (
        "it reached max_duration_s with gates undecided"
    )


def test_a_soak_ends_after_a_settling_look_begun_after_the_minimum() -> None:
    """A shape whose boundary is any moment (a soak: then its cooldown) is not looked at
    again: the settling look, begun at the minimum or later, decides."""
    shape = FakeShape(every_s=1, confirms=False)
    rule = UntilDecided(GATES, min_s=30, max_s=400, shape=shape)
    shape.now = 25
    settled_look(rule, 25, began_s=20)
    assert rule.tick(25) is None and shape.asked == []
    assert rule.label() == "2/2 settled; a look begun after +30 s decides"
    shape.now = 36
    settled_look(rule, 36, began_s=31)
    assert rule.tick(36) is None and shape.asked == [30]  # its cooldown runs first
    shape.now = 40
    assert rule.tick(40) == "every key and blocking gate decided at +36 s (load.until: decided)"


def test_the_record_names_what_stopped_the_load_and_each_key_gate_as_last_seen() -> None:
    rule = UntilDecided(GATES, min_s=10, max_s=60)
    rule.look(
        50,
        [
            result("served", "UNDECIDED", False, n=300, needs_n=607, bound_text="[0.98, 1] (m)"),
            result("no_oom", "UNDECIDED", True, n=900, settled_by="observed"),
        ],
    )
    rule.stopped(60.2, None)  # the load generator's deadline: max_duration_s
    record = rule.record()
    assert record["decided"] is False and record["decided_at_s"] is None
    assert record["looked_at_s"] == 50 and record["looks"] == 1
    assert record["stopped_at_s"] == 60.2
    assert record["stopped_because"].startswith("it reached max_duration_s")
    served, no_oom = record["gates"]
    assert served == {
        "id": "served",
        "key": True,
        "decision": "UNDECIDED",
        "settled": False,
        "settled_by": None,
        "n": 300,
        "needs_n": 607,
        "bound": "[0.98, 1] (m)",
    }
    assert no_oom["settled"] and no_oom["settled_by"] == "observed"
    assert RunMeta.model_validate({"until": record}).dumped()["until"] == record
    assert rule.label() == "1/2 settled; waiting: served n=300/607"


def test_an_abort_is_recorded_as_the_reason_and_the_rules_own_reason_is_kept_short() -> None:
    rule = UntilDecided(GATES, min_s=10, max_s=60)
    rule.stopped(12, "aborted at +12 s by gate no_oom: count = 1")
    assert rule.record()["stopped_because"] == "aborted at +12 s by gate no_oom: count = 1"
    rule = UntilDecided(GATES, min_s=10, max_s=60)
    rule.look(11, [result("served", "PASS", True), result("no_oom", "UNDECIDED", True)])
    rule.stopped(11.5, rule.tick(11.5))
    assert rule.record()["stopped_because"] == "every key and blocking gate decided at +11 s"


def test_meta_json_keeps_the_rules_record(tmp_path: Path) -> None:
    plan = plan_from_dict(
        {
            "traffic": {"classes": {"short_qa_critical": {}}},
            "load": {"until": "decided", "min_duration_s": 10, "max_duration_s": 60},
        }
    )
    orchestrator = Orchestrator(plan, tmp_path, Distribution(), Console(file=io.StringIO()))
    orchestrator.until = UntilDecided(GATES, 10, 60)
    orchestrator._write_meta("running")
    meta = json.loads((tmp_path / schema.META_FILE).read_text())
    assert meta["until"]["max_duration_s"] == 60 and meta["until"]["stopped_at_s"] is None
    assert [g["id"] for g in meta["until"]["gates"]] == ["served", "no_oom"]
    assert meta["plan"]["load"]["duration_s"] == 60  # the maximum: what readers plan for


def test_the_console_shows_the_key_gates_way_to_a_decision(tmp_path: Path) -> None:
    rule = UntilDecided(GATES, min_s=10, max_s=60)
    sink = RecordSink(TableWriter(tmp_path, "requests"))
    progress = Progress(
        Console(file=io.StringIO()), sink, tmp_path / "samples.jsonl", 62.0, lambda: 6,
        lambda: "0", decided=rule.label,
    )  # fmt: skip
    assert "until=[2 key and 0 blocking gates, not judged yet]" in progress.snapshot().line()
    rule.look(10, [result("served", "UNDECIDED", False, n=50, needs_n=109),
                   result("no_oom", "UNDECIDED", True, n=80)])  # fmt: skip
    snapshot = progress.snapshot()
    assert "until=[1/2 settled; waiting: served n=50/109]" in snapshot.line()
    shown = io.StringIO()
    Console(file=shown, width=200).print(snapshot.table())
    row = r"gates \(until decided\) +│ 1/2 settled; waiting: served n=50/109"
    assert re.search(row, shown.getvalue())
