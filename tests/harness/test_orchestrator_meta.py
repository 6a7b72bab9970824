"""meta.json from the run's first write: the server profile the run uses, kept for whoever
judges the run later."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from contract import servers
from gates import run_profile, schema
from gates.rundir import load_run
from harness.loadgen import Distribution
from harness.orchestrator import Orchestrator
from harness.plan import load_plan

PLANS = Path(__file__).resolve().parents[2] / "harness" / "plans"


def test_meta_json_keeps_the_profile_from_the_start_of_the_run(tmp_path: Path) -> None:
    plan = load_plan(PLANS / "external.yaml", ["target.kind=vllm"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    orchestrator = Orchestrator(plan, run_dir, Distribution(), Console(file=io.StringIO()))
    orchestrator._write_meta("running")  # what run() writes before it starts the target
    meta = json.loads((run_dir / schema.META_FILE).read_text())
    assert meta["target"]["kind"] == "vllm"  # the profile's kind, not the target type
    assert meta[run_profile.SNAPSHOT_KEY] == run_profile.snapshot(servers.profile("vllm"))
    run = load_run(run_dir)
    assert run.profile == servers.profile("vllm") and run.profile_source == "meta.json"
    assert run.profile_note is None
