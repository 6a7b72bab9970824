"""`transformers serve`, a second real serving stack, judged end to end: `kvgate qualify
harness/plans/transformers.yaml --runs 1` against the server tools/transformers_serve.py
sets up (`make transformers`) and this test starts and stops. The correct server must PASS
on the gates that apply, on a load that ran until they were decided; the kill must FAIL
availability and leave the server up again. Deselected by default; `make test-engines`
runs it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "harness" / "plans" / "transformers.yaml"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "transformers_serve", ROOT / "tools" / "transformers_serve.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = _tool()
pytestmark = [
    pytest.mark.real_engine,
    pytest.mark.skipif(
        TOOL.installed(TOOL.root()) is None,
        reason="no transformers serve install: make transformers",
    ),
]
# What a server without telemetry cannot show; the plan sends no batch work either.
APPLIES = {"no_oom", "availability", "timeouts_disconnects", "ttft_critical_p95"}


@pytest.fixture(scope="module")
def qualified(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[int, dict[str, Any], Path]]:
    if TOOL.running_pid(TOOL.root()) is not None:
        pytest.fail("a transformers serve started elsewhere is running: stop it first")
    TOOL.start(TOOL.root(), TOOL.DEFAULT_PORT, TOOL.DEFAULT_BLOCKS, 180.0)
    try:
        out = tmp_path_factory.mktemp("transformers") / "q"
        argv = [sys.executable, "-m", "harness.cli", "qualify", str(PLAN), "--runs", "1"]
        argv += ["--mutants", "all", "--out", str(out), "--json"]
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1100)
        assert proc.stdout.strip(), proc.stderr[-3000:]
        yield proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1]), out
    finally:
        TOOL.stop(TOOL.root())


def _verdict(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "verdict.json").read_text())
    return data


@pytest.mark.timeout(1200)
def test_the_server_passes_the_gates_that_apply_on_a_load_run_until_decided(
    qualified: tuple[int, dict[str, Any], Path],
) -> None:
    code, q, out = qualified
    assert code == 0 and q["result"] == "PASS", q["reasons"]
    v = _verdict(out / "policy-01")
    assert v["status"] == "PASS", v["run_problems"]
    applied = {g["id"] for g in v["gates"] if g["status"] != "N/A"}
    assert applied == APPLIES
    meta = json.loads((out / "policy-01" / "meta.json").read_text())
    until = meta["until"]
    assert until["decided"] and until["stopped_at_s"] < until["max_duration_s"]
    availability = next(g for g in v["gates"] if g["id"] == "availability")
    assert availability["n_samples"] >= 381  # what the fixed-n verdict needs, at the least


@pytest.mark.timeout(1200)
def test_the_kill_fails_availability_and_the_server_comes_back(
    qualified: tuple[int, dict[str, Any], Path],
) -> None:
    _, q, out = qualified
    row = q["mutants"]["killed"]
    assert row["outcome"] == "detected" and "availability" in row["failed_gates"], row
    assert _verdict(out / "mutant-killed")["status"] == "FAIL"
    assert TOOL.healthy(TOOL.DEFAULT_PORT)  # restarted by the fault's rollback
