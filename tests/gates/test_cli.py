"""`kvgate gate`: exit codes, verdict.json and junit.xml over synthetic runs, and what the
console and junit.xml say of the evidence checks."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gates import evaluate_run
from gates.cli import main
from gates.junit import EVIDENCE_SUITE, SUITE
from gates.spec import load_gate_file
from reports.synthetic import make_run
from tests.gates.toy_check import FINDING as TOY_FINDING
from tests.gates.toy_check import NAME as TOY_CHECK
from tests.gates.toy_check import ghost_builder, registered


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("synthetic")
    return {
        "clean": make_run(base / "clean", 4000, 6000),
        "oom": make_run(base / "oom", 4000, 6000, flavour="oom", fmt="jsonl"),
    }


def test_clean_run_passes_every_builtin_gate(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(runs["clean"])]) == 0
    assert "verdict: PASS" in capsys.readouterr().out
    verdict = json.loads((runs["clean"] / "verdict.json").read_text())
    assert verdict["status"] == "PASS" and verdict["exit_code"] == 0
    assert all(g["status"] == "PASS" and g["n_samples"] > 0 for g in verdict["gates"])


def test_oom_run_fails_with_exit_3_and_junit_failures(runs: dict[str, Path]) -> None:
    assert main([str(runs["oom"]), "--quiet"]) == 3
    suite = ET.parse(runs["oom"] / "junit.xml").getroot()
    cases = {c.get("name"): c for c in suite.iter("testcase") if c.get("classname") == SUITE}
    assert len(cases) == len(load_gate_file().gates) + 1 and "run_validity" in cases
    assert cases["no_oom"].find("failure") is not None
    assert cases["batch_stops_at_peak"].find("failure") is None
    assert suite.get("failures") == str(sum(c.find("failure") is not None for c in cases.values()))


def test_evaluate_run_library_call_writes_files(runs: dict[str, Path]) -> None:
    verdict = evaluate_run(runs["oom"])
    assert verdict.exit_code == 3
    failed = {g.id for g in verdict.failed}
    assert {"no_oom", "tenant_share_cap", "cancel_release_p99"} <= failed
    oom = next(g for g in verdict.gates if g.id == "no_oom")
    assert oom.evidence and oom.first_breach_t is not None
    assert (runs["oom"] / "verdict.json").is_file() and (runs["oom"] / "junit.xml").is_file()


@pytest.mark.parametrize(
    ("effect", "shown", "element"),
    [("note", "note", "system-out"), ("invalid", "run", "error")],
)
def test_the_console_and_junit_show_what_an_evidence_check_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], effect: str, shown: str, element: str
) -> None:
    path = ghost_builder().write(tmp_path / "run")
    with registered(effect):
        exit_code = main([str(path)])
    assert effect != "invalid" or exit_code == 5
    lines = capsys.readouterr().out.splitlines()
    assert f"  {shown}: {TOY_FINDING}" in lines
    line = next(x for x in lines if x.startswith("  evidence checks: "))
    assert f"{TOY_CHECK} ({'note' if effect == 'note' else 'makes the run INVALID'})" in line
    suite = ET.parse(path / "junit.xml").getroot()
    case = next(
        c
        for c in suite.iter("testcase")
        if c.get("classname") == EVIDENCE_SUITE and c.get("name") == TOY_CHECK
    )
    assert TOY_FINDING in (case.findtext(element) or "")
