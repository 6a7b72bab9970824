"""The metric registry: what every metric must declare, how modules are found, the gates
README's table against the declarations, and a toy metric added by the recipe."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

import gates
import gates.evidence
from gates.evaluator import evaluate
from gates.evidence import CHECKS
from gates.evidence import MODULES as EVIDENCE_MODULES
from gates.metrics import MODULES, REGISTRY, Cause
from gates.registry import metric
from gates.rundir import load_run
from gates.spec import load_gate_file
from gates.verdict import Status, Verdict
from tests.gates.builder import RunBuilder, cpu_warning, gate_file
from tests.gates.conftest import gate
from tests.reports.verdicts import ttft_gate, verdict

README = Path(gates.__file__).with_name("README.md")
TOY_MODULE = "tests.gates.toy_metric"


def test_a_metric_that_does_not_say_whether_it_is_a_timing_or_what_it_points_to_is_refused() -> (
    None
):
    # each call leaves out a required declaration on purpose: the refusal is under test
    with pytest.raises(TypeError, match="timing"):
        metric("undeclared", filters=(), unit="s", kind="trend", cause=Cause.NONE)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="cause"):
        metric("undeclared", filters=(), unit="s", kind="trend", timing=True)  # type: ignore[call-arg]
    assert "undeclared" not in REGISTRY


@pytest.mark.parametrize(
    ("declared", "problem"),
    [
        ({"timing": "yes", "cause": Cause.NONE}, "timing must be True or False, got 'yes'"),
        ({"timing": True, "unit": "ms", "cause": Cause.NONE}, "is measured in seconds"),
        ({"timing": False, "cause": "release_defect"}, "cause must be a gates.registry.Cause"),
        ({"timing": False, "cause": Cause.RELEASE_DEFECT, "cause_weight": 0}, "whole number"),
        ({"timing": False, "cause": Cause.NONE, "cause_weight": 3}, "weighs no cause"),
    ],
)
def test_declarations_are_checked_when_the_metric_registers(
    declared: dict[str, Any], problem: str
) -> None:
    arguments: dict[str, Any] = {"filters": (), "unit": "s", "kind": "trend", **declared}
    with pytest.raises(ValueError, match=re.escape(problem)):
        metric("misdeclared", **arguments)
    assert "misdeclared" not in REGISTRY


def test_every_metrics_module_of_the_package_is_discovered() -> None:
    """A new gates/metrics_*.py registers its metrics without a line anywhere else."""
    files = {f"gates.{p.stem}" for p in Path(gates.__file__).parent.glob("metrics_*.py")}
    assert {m.__name__ for m in MODULES} == files
    assert {d.fn.__module__ for d in REGISTRY.values()} == files


def readme_metrics() -> dict[str, dict[str, str]]:
    """The gates README's metrics table: metric name -> its cells by column."""
    text = README.read_text()
    section = text[text.index("\n## Metrics\n") : text.index("\n### The security gates")]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows: dict[str, dict[str, str]] = {}
    for line in lines[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        (name,) = re.findall(r"`([a-z0-9_]+)`", cells["metric"])
        assert name not in rows, f"{name} appears twice in the README's metrics table"
        rows[name] = cells
    return rows


def readme_evidence_checks() -> dict[str, dict[str, str]]:
    """The gates README's table of evidence checks: check name -> its cells by column."""
    text = README.read_text()
    section = text[text.index("\n## Evidence checks\n") : text.index("\n### Clock offset")]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows: dict[str, dict[str, str]] = {}
    for line in lines[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        name = cells["check"].strip("`")
        assert name not in rows, f"{name} appears twice in the README's evidence checks"
        rows[name] = cells
    return rows


def test_every_evidence_check_module_is_discovered_and_the_readme_lists_each_check() -> None:
    """A new gates/evidence/checks_*.py registers its checks by itself; the README's table
    shows each with its order and its description (the first line of its docstring)."""
    folder = Path(gates.evidence.__file__).parent
    files = {f"gates.evidence.{p.stem}" for p in folder.glob("checks_*.py")}
    assert {m.__name__ for m in EVIDENCE_MODULES} == files
    assert {c.fn.__module__ for c in CHECKS.values()} == files
    rows = readme_evidence_checks()
    assert list(rows) == [c.name for c in sorted(CHECKS.values(), key=lambda c: (c.order, c.name))]
    for name, check in CHECKS.items():
        assert rows[name]["order"] == str(check.order), name
        assert rows[name]["guards"] == check.description, name


def cause_cell(cause: Cause, weight: int) -> str:
    if cause is Cause.NONE:
        return "—"
    return f"`{cause}`" + (f" ×{weight}" if weight != 1 else "")


def test_the_readme_metrics_table_shows_what_each_metric_declares() -> None:
    rows = readme_metrics()
    assert set(rows) == set(REGISTRY)
    for name, d in REGISTRY.items():
        shown = rows[name]
        assert shown["kind"] == d.kind, name
        assert shown["unit"] == d.unit, name
        assert shown["timing"] == ("yes" if d.timing else "no"), name
        assert shown["cause"] == cause_cell(d.cause, d.cause_weight), name


def test_a_verdict_carries_its_declarations_and_an_old_one_takes_them_from_the_registry() -> None:
    written = verdict(Status.PASS, ttft_gate(metric="retired_metric")).to_dict()
    assert written["gates"][0]["timing"] is True
    # written with its declarations, it needs no registry: its metric may be long gone
    assert Verdict.from_dict(written).gates[0].timing is True
    old = verdict(Status.PASS, ttft_gate()).to_dict()
    for field in ("timing", "cause", "cause_weight"):
        del old["gates"][0][field]
    [read] = Verdict.from_dict(old).gates
    assert read.timing is True and read.cause is Cause.PRIORITY_RULES and read.cause_weight == 1
    for field in ("timing", "cause", "cause_weight"):
        del written["gates"][0][field]
    with pytest.raises(ValueError, match="'retired_metric' is no longer registered"):
        Verdict.from_dict(written)


def test_a_result_round_trips_through_verdict_json() -> None:
    gate_result = ttft_gate()
    again = Verdict.from_dict(verdict(Status.PASS, gate_result).to_dict()).gates[0]
    assert asdict(again) == asdict(gate_result)


@pytest.fixture
def toy_metric() -> Iterator[str]:
    """The toy metric module imported (so registered) for one test, then taken out again."""
    before = dict(REGISTRY)
    sys.modules.pop(TOY_MODULE, None)
    module = importlib.import_module(TOY_MODULE)
    yield str(module.NAME)
    REGISTRY.clear()
    REGISTRY.update(before)
    sys.modules.pop(TOY_MODULE, None)


def test_a_toy_metric_in_one_module_is_judged_by_a_gate(toy_metric: str, tmp_path: Path) -> None:
    """The recipe: one module with an @metric function, and a gate that names it. Its
    declared timing decides what a starved load generator's run can prove."""
    gates = load_gate_file(
        gate_file(
            tmp_path / "toy.yaml",
            f"""
  - id: token_pace
    title: P95 time per output token at most 50 ms
    metric: {toy_metric}
    pass: "p(95) <= 50ms"
    key: true
    blocks: a slow stream of tokens reads as a stalled answer
""",
        )
    )

    def run(name: str, per_token_s: float, starved: bool = False) -> Verdict:
        b = RunBuilder()
        for i in range(400):
            b.request(
                f"r{i}",
                t=20 + i * 0.1,
                ttft_s=0.2,
                e2e_s=0.2 + 99 * per_token_s,
                completion_tokens=100,
            )
        return evaluate(load_run((cpu_warning(b) if starved else b).write(tmp_path / name)), gates)

    fast, slow = run("fast", 0.02), run("slow", 0.1)
    assert gate(fast, "token_pace").value == pytest.approx(0.02)
    assert fast.status == Status.PASS
    assert gate(slow, "token_pace").timing and slow.status == Status.FAIL
    starved = run("starved", 0.1, starved=True)
    assert gate(starved, "token_pace").status == Status.FAIL
    assert starved.status == Status.INVALID
