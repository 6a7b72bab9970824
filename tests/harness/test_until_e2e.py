"""`load.until: decided` end to end: a tiny plan against the embedded reference deployment
whose key gates settle within seconds stops at the first look that decides them, long before
its maximum, and meta.json and the verdict say so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gates import schema

ROOT = Path(__file__).resolve().parents[1].parent
PLAN = ROOT / "tests" / "harness" / "plans" / "until.yaml"


@pytest.mark.e2e
def test_a_load_that_runs_until_decided_stops_once_its_key_gates_are(tmp_path: Path) -> None:
    run_dir = tmp_path / "until"
    cmd = [sys.executable, "-m", "harness.run_cmd", str(PLAN), "--out", str(run_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)
    verdict = json.loads((run_dir / schema.VERDICT_FILE).read_text())
    assert proc.returncode == verdict["exit_code"] == 0, proc.stderr[-3000:]
    meta = json.loads((run_dir / schema.META_FILE).read_text())
    until = meta["until"]
    assert until["decided"]
    assert until["stopped_because"].startswith("every key and blocking gate decided")
    assert (until["min_duration_s"], until["max_duration_s"]) == (10, 60)
    # stopped by the rule (the reason above, not the maximum): on a look begun at the
    # minimum or later, and no earlier than that look decided
    assert until["min_duration_s"] <= until["decided_at_s"] <= until["stopped_at_s"]
    stress = meta["windows"]["stress"]
    assert stress[1] - stress[0] == pytest.approx(until["stopped_at_s"], abs=1.0)
    assert meta["load_generator"]["stopped_early"].endswith("(load.until: decided)")
    gates = {g["id"]: g for g in until["gates"]}
    assert (
        gates["served"]["decision"] == "PASS" and gates["served"]["settled_by"] == "anytime bound"
    )
    assert gates["served"]["n"] >= gates["served"]["needs_n"] > 0
    assert gates["no_oom"]["settled"] and gates["no_oom"]["settled_by"] == "observed"
    # the verdict judges what was collected as always, and says how the load ended
    assert any(
        note.startswith("load.until: decided: the load stopped") for note in verdict["notes"]
    )
    assert {g["id"]: g["status"] for g in verdict["gates"]} == {"served": "PASS", "no_oom": "PASS"}
    assert "gates (until decided)" in proc.stderr or "until=[" in proc.stderr
