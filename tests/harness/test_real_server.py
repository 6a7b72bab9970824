"""Against a real OpenAI-compatible server, when one is running (docs/real-server.md):
`KVGATE_REAL_SERVER=http://127.0.0.1:18080 pytest tests/harness/test_real_server.py`.
Skipped otherwise: the logic it relies on (profiles, applicability, preflight, faults,
proxy) is tested without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
URL = os.environ.get("KVGATE_REAL_SERVER")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not URL, reason="set KVGATE_REAL_SERVER to a running server's URL"),
]


@pytest.mark.timeout(700)  # past the run's own 600 s limit, so that limit is what ends it
def test_the_external_plan_passes_a_healthy_server_on_the_gates_that_apply(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "real"
    cmd = [sys.executable, "-m", "harness.cli", "run", str(ROOT / "harness/plans/external.yaml")]
    cmd += ["--target-url", str(URL), "--set", "faults=[]", "--out", str(run_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    statuses = {g["id"]: g["status"] for g in verdict["gates"]}
    assert statuses["availability"] == "PASS", proc.stdout[-3000:]
    assert statuses["tenant_share_cap"] == "N/A"  # no server of this kind shows tenant shares
    assert proc.returncode == verdict["exit_code"]
