"""The seed's release gates on a real vLLM, with its real misconfigurations as the teeth:
`kvgate qualify harness/plans/vllm.yaml --runs 1` end to end against vLLM's CPU build (the
install `make vllm` caches). The correct configuration must PASS on at least ten applying
gates; each misconfiguration must FAIL the gate meant for it and so fail its run; the kill
must fail availability and leave the server up again. Deselected by default (pyproject's
addopts); `make test-engines` runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.engines.vllm import cpu_install
from harness.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "harness" / "plans" / "vllm.yaml"
INSTALL = cpu_install()
pytestmark = [
    pytest.mark.real_engine,
    pytest.mark.skipif(not INSTALL.complete, reason=f"no vLLM CPU install: {INSTALL.why}"),
]
# What vLLM cannot show, by its nature: no tenants, no gateway ledger, no API keys; and the
# plan has no peaks for the batch gate.
NOT_APPLICABLE = {
    "tenant_share_cap",
    "failover_no_double_reservation",
    "priority_escalation",
    "batch_stops_at_peak",
}
MISCONFIGURATIONS = tuple(load_plan(str(PLAN)).misconfigurations)


@pytest.fixture(scope="module")
def qualified(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("vllm") / "q"
    argv = [sys.executable, "-m", "harness.cli", "qualify", str(PLAN), "--runs", "1"]
    argv += ["--mutants", "all", "--out", str(out), "--json"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1000)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1]), out


def verdict(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "verdict.json").read_text())
    return data


def why_not(out: Path, q: dict[str, Any]) -> str:
    """What a policy run that did not PASS says about itself: the gates that did not pass,
    or, where it wrote no verdict, the end of its log."""
    run = out / "policy-01"
    if not (run / "verdict.json").is_file():
        log = out / "policy-01.log"
        tail = log.read_text()[-3000:] if log.is_file() else "(no log)"
        return f"{q['reasons']}; no verdict; the run's log ends:\n{tail}"
    v = verdict(run)
    gates = [(g["id"], g["status"], g["value"], g["n_samples"]) for g in v["gates"]]
    bad = [g for g in gates if g[1] not in ("PASS", "N/A")]
    return f"{q['reasons']}; {v['status']}: {v['run_problems']} {bad}"


@pytest.mark.timeout(1100)
def test_the_correct_configuration_passes_on_the_seed_gates(
    qualified: tuple[int, dict[str, Any], Path],
) -> None:
    code, q, out = qualified
    assert code == 0 and q["result"] == "PASS", why_not(out, q)
    v = verdict(out / "policy-01")
    assert v["status"] == "PASS", v["run_problems"]
    gates = {g["id"]: g for g in v["gates"]}
    applied = {g for g, r in gates.items() if r["status"] != "N/A"}
    assert len(applied) >= 10 and set(gates) - applied == NOT_APPLICABLE
    for gate_id, needed in (("cancel_release_p99", 368), ("preempted_complete", 381)):
        gate = gates[gate_id]
        assert gate["status"] == "PASS" and gate["n_samples"] >= needed, gate
        assert gate["interval"] is not None
    # the recorder saw every preemption vLLM itself counted
    events = pd.read_parquet(out / "policy-01" / "server_events.parquet")
    samples = pd.read_parquet(out / "policy-01" / "samples.parquet")
    counter = samples[samples["metric"] == "vllm:num_preemptions_total"]["value"]
    recorded = int(events["event"].eq("preempted").sum())
    assert recorded > 0 and counter.max() - counter.min() <= recorded


@pytest.mark.timeout(1100)
@pytest.mark.parametrize("name", MISCONFIGURATIONS)
def test_each_misconfiguration_fails_its_own_gate_and_its_run(
    qualified: tuple[int, dict[str, Any], Path], name: str
) -> None:
    _, q, out = qualified
    row = q["mutants"][name]
    own = [g for g in row["failed_gates"] if g in row["expected_gates"]]
    assert row["outcome"] == "detected" and own, row
    assert verdict(out / f"mutant-{name}")["status"] == "FAIL"


@pytest.mark.timeout(1100)
def test_the_killed_server_is_back_and_serving_after_its_restart(
    qualified: tuple[int, dict[str, Any], Path],
) -> None:
    _, _, out = qualified
    run = out / "mutant-killed"
    [fault] = pd.read_parquet(run / "faults.parquet").to_dict("records")
    assert fault["kind"] == "kill" and fault["outcome"] == "ok", fault
    assert str(fault["rollback"]).startswith("restarted")
    # the whole tree was killed (API server, EngineCore, worker), and the restart was healthy
    # again (the rollback waits for /health) before the run ended
    params = json.loads(fault["params"])
    assert len(params["pids"]) >= 3 and str(fault["pid"]) not in fault["rollback"]
    meta = json.loads((run / "meta.json").read_text())
    assert fault["t_end"] <= meta["t_end"]
    gates = {g["id"]: g["status"] for g in verdict(run)["gates"]}
    assert gates["availability"] == "FAIL"
