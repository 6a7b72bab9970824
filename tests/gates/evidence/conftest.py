"""Hand-built runs that PASS a small gate file, so each test shows what one defect in the
records does to the verdict (gates/evidence)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gates.evaluator import evaluate
from gates.rundir import load_run
from gates.spec import GateFile, load_gate_file
from gates.verdict import Verdict
from tests.gates.builder import RunBuilder, gate_file

GATES = (
    """
  - id: ttft_p95
    title: P95 TTFT at most 1 s
    metric: ttft
    pass: "p(95) <= 1s"
    key: true
    blocks: the critical tier is sold on its first token""",
    """
  - id: availability
    title: At least 90% of requests served
    metric: availability
    pass: "rate >= 0.9"
    key: true
    blocks: a request that fails is an outage for its client""",
    """
  - id: no_oom
    title: No OOM
    metric: oom_events
    pass: "count == 0"
    key: true
    blocks: an OOM kills every request on its replica""",
)

Judge = Callable[[RunBuilder], Verdict]


def clean(n: int = 100) -> RunBuilder:
    """`n` answered requests from +20 s, half a second apart, each admitted and finished by
    replica r0: a run that PASSes every gate of GATES."""
    b = RunBuilder()
    for i in range(n):
        t = 20 + i * 0.5
        b.request(f"r{i}", t=t, ttft_s=0.1, e2e_s=0.3, chunks=5, replica="r0")
        b.event("admitted", t + 0.05, request_id=f"r{i}", priority="interactive")
        b.event("finished", t + 0.3, request_id=f"r{i}", priority="interactive")
    return b


@pytest.fixture
def small_gates(tmp_path: Path) -> GateFile:
    return load_gate_file(gate_file(tmp_path / "evidence.gates.yaml", *GATES))


@pytest.fixture
def check(tmp_path: Path, small_gates: GateFile) -> Judge:
    """Write a builder's run (JSON lines) and judge it by GATES (the `judge` of the gate
    tests judges by the built-in gates)."""
    counter = iter(range(1000))

    def run(builder: RunBuilder) -> Verdict:
        return evaluate(load_run(builder.write(tmp_path / f"run{next(counter)}")), small_gates)

    return run


def findings(verdict: Verdict, check: str) -> list[dict[str, Any]]:
    """The findings of `check` in a verdict."""
    return [f for f in verdict.evidence["findings"] if f["check"] == check]


def messages(verdict: Verdict, check: str) -> list[str]:
    """The messages of the findings of `check` in a verdict."""
    return [f["message"] for f in findings(verdict, check)]
