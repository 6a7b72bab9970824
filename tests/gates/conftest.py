"""Fixtures shared by the gate tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gates.evaluator import evaluate
from gates.rundir import load_run
from gates.spec import load_gate_file
from gates.verdict import GateResult, Verdict
from tests.gates.builder import RunBuilder


@pytest.fixture
def judge(tmp_path: Path) -> Callable[[RunBuilder], Verdict]:
    """Write a builder's run and judge it with the built-in gates."""
    counter = iter(range(1000))

    def run(builder: RunBuilder) -> Verdict:
        path = builder.write(tmp_path / f"run{next(counter)}")
        return evaluate(load_run(path), load_gate_file())

    return run


def gate(verdict: Verdict, gate_id: str) -> GateResult:
    return next(g for g in verdict.gates if g.id == gate_id)
