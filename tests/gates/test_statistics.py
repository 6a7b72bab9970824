"""Statistics come from raw records and equal numpy's on the same data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gates.estimate import estimate
from gates.evaluator import evaluate
from gates.rundir import load_run
from gates.spec import load_gate_file
from gates.terms import Threshold
from tests.gates.builder import RunBuilder, gate_file


@pytest.mark.parametrize("q", [50, 90, 95, 99, 99.9])
def test_percentiles_equal_numpy(tmp_path: Path, q: float) -> None:
    rng = np.random.default_rng(int(q * 10))
    ttft = rng.lognormal(-1.0, 0.8, 257)
    builder = RunBuilder()
    for i, value in enumerate(ttft):
        builder.request(f"r{i}", t=20 + i * 0.1, ttft_s=float(value), priority="critical")
    run = load_run(builder.write(tmp_path / "run"))
    gates = gate_file(
        tmp_path / "g.yaml",
        f'  - {{id: p, title: P, metric: ttft, pass: "p({q}) < 100s",\n'
        "     filter: {priority: [critical]}}",
    )
    verdict = evaluate(run, load_gate_file(gates))
    assert verdict.gates[0].value == np.percentile(ttft, q)
    assert verdict.gates[0].n_samples == len(ttft)


def statistic(values: np.ndarray, threshold: str) -> float:
    return estimate(values, Threshold.model_validate(threshold), 0.95).value


def test_other_statistics_match_numpy() -> None:
    values = np.array([0.5, 0.1, 2.0, 0.0, 1.0])
    assert statistic(values, "max < 1") == 2.0
    assert statistic(values, "min < 1") == 0.0
    assert statistic(values, "mean < 1") == pytest.approx(values.mean())
    assert statistic(values, "count < 1") == 5
    assert statistic(np.array([1.0, 0.0, 1.0, 1.0]), "rate > 0.5") == 0.75
    assert np.isnan(statistic(np.array([]), "p(99) < 1"))
    assert statistic(np.array([]), "count == 0") == 0


def test_rounded_locust_style_values_are_not_used(tmp_path: Path) -> None:
    """Raw TTFTs that Locust would round to 2 significant digits keep their precision."""
    builder = RunBuilder()
    for i, value in enumerate([0.9004, 0.9003, 0.9002, 0.9001]):
        builder.request(f"r{i}", ttft_s=value, priority="critical")
    run = load_run(builder.write(tmp_path / "run"))
    gates = gate_file(
        tmp_path / "g.yaml", '  - {id: m, title: M, metric: ttft, pass: "max <= 900ms"}'
    )
    result = evaluate(run, load_gate_file(gates)).gates[0]
    assert result.value == 0.9004 and result.status == "FAIL"
