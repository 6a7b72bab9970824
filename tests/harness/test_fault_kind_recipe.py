"""The recipe of docs/extending.md ("A fault kind"): one module in harness/faults/kinds/ is a
fault kind. The plan accepts its entries, the scheduler fires it and journals the effect it
declares, and the gates read that effect, with no other file touched.

The toy module below is written to a temporary folder that is added to the kinds package's
path, as if it had been dropped into harness/faults/kinds/, in a fresh interpreter, so this
session's registry and plan model stay as shipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gates import schema
from gates.evaluator import evaluate
from gates.rundir import load_run, read_jsonl
from gates.spec import load_gate_file
from gates.verdict import Status
from tests.gates.builder import T0, RunBuilder
from tests.gates.conftest import gate

ROOT = Path(__file__).resolve().parents[2]

TOY_KIND = '''
"""A toy fault kind, `crash`: it "kills" a replica by writing a marker file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from contract import FaultEffect
from harness.faults.base import FaultContext, FaultRecord, FaultSpec, fault_kind


class CrashFault(FaultSpec):
    kind: Literal["crash"] = "crash"
    replica: str
    marker: str

    def declared_effect(self) -> FaultEffect:
        return FaultEffect.KILLS


@fault_kind(CrashFault)
class CrashAction:
    def __init__(self, spec: CrashFault, context: FaultContext) -> None:
        self.spec = spec
        self.target = spec.replica
        self.hold_s = 0.0
        self.rollback_limit_s = 1.0

    def apply(self, record: FaultRecord) -> None:
        record.begin()
        Path(self.spec.marker).write_text("crashed")

    def rollback(self, record: FaultRecord) -> None:
        Path(self.spec.marker).write_text("restarted")
        record.rollback.append("marker reset")
'''

PLAN = """
name: toy
target: {type: reference, replicas: 2}
traffic:
  classes:
    short_qa_critical: {weight: 1}
load: {users: 2, duration_s: 60}
faults:
  - {kind: crash, at_s: 0, replica: r1, marker: MARKER}
"""

# Fires the plan's faults as `kvgate run` does, with the toy folder on the kinds' path.
FIRE = """
import sys, time
from pathlib import Path

import gevent

import harness.faults.kinds

harness.faults.kinds.__path__.append(sys.argv[1])
from gates import schema
from harness.faults.scheduler import FaultScheduler
from harness.plan import load_plan
from harness.rundir import TableWriter

plan = load_plan(sys.argv[2])
writer = TableWriter(Path(sys.argv[3]), schema.FAULTS)
scheduler = FaultScheduler(plan.faults, None, writer, lambda _: 0)
scheduler.start(time.monotonic())
deadline = time.monotonic() + 60
while writer.rows < len(plan.faults) and time.monotonic() < deadline:
    gevent.sleep(0.05)
scheduler.stop()
"""


def fire_toy(tmp_path: Path) -> dict[str, Any]:
    kinds, out = tmp_path / "kinds", tmp_path / "fired"
    kinds.mkdir()
    out.mkdir()
    (kinds / "crash.py").write_text(TOY_KIND)
    marker = tmp_path / "marker"
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("MARKER", str(marker)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", FIRE, str(kinds), str(plan), str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.read_text() == "restarted"  # applied, then rolled back
    [row] = read_jsonl(out / f"{schema.FAULTS}.jsonl").rows
    return row


def test_a_kind_in_one_module_is_planned_fired_journaled_and_judged(tmp_path: Path) -> None:
    row = fire_toy(tmp_path)
    assert (row["kind"], row["target"], row["effect"]) == ("crash", "r1", "kills")
    assert row["outcome"] == "ok" and row["rollback"] == "marker reset"
    assert json.loads(row["params"])["replica"] == "r1"
    # The gates know nothing of `crash`: its declared effect makes it r1's death, which
    # frees what r1 held when it came half a second after the cancellations.
    b = RunBuilder()
    b.rows[schema.FAULTS].append(row | {"t_start": T0 + 30.5, "t_end": T0 + 31})
    for i in range(400):
        rid = f"k{i}"
        b.request(rid, t=29, traffic_class="cancel_storm", outcome="cancelled", cancel_at=30.0)
        b.event("admitted", 29.1, replica="r1", request_id=rid, tenant="acme", blocks=4)
    result = gate(
        evaluate(load_run(b.write(tmp_path / "run")), load_gate_file()), "cancel_release_p99"
    )
    assert result.status == Status.PASS and result.censored == 0
    assert any("freed by a replica's death" in n for n in result.notes)
