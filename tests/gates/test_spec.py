"""The gate spec: threshold parsing, the built-in gates, and errors that name the YAML path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.cli import main
from gates.metrics import REGISTRY
from gates.spec import GateSpec, GateSpecError, checked_gate_file, load_gate_file
from gates.terms import Threshold
from gates.verdict import Status
from tests.gates.builder import gate_file
from tests.reports.verdicts import ttft_gate, verdict


@pytest.mark.parametrize(
    ("text", "stat", "quantile", "op", "value"),
    [
        ("p(95) <= 0.9", "p", 95.0, "<=", 0.9),
        ("p(99.9)<900ms", "p", 99.9, "<", 0.9),
        ("rate > 99%", "rate", None, ">", 0.99),
        ("count == 0", "count", None, "==", 0.0),
        ("max <= 1.5e-1", "max", None, "<=", 0.15),
    ],
)
def test_threshold_parses_k6_style(
    text: str, stat: str, quantile: float | None, op: str, value: float
) -> None:
    t = Threshold.model_validate(text)
    assert (t.statistic, t.quantile, t.op) == (stat, quantile, op)
    assert t.value == pytest.approx(value)


def test_threshold_holds_and_nan_never_holds() -> None:
    t = Threshold.model_validate("p(95) <= 0.9")
    assert t.holds(0.9) and not t.holds(0.9001) and not t.holds(float("nan"))


def test_builtin_gates_carry_the_seed_numbers() -> None:
    gates = {g.id: g for g in load_gate_file().gates}
    assert len(gates) == 15
    assert gates["priority_under_pressure"].pass_.value == pytest.approx(0.9)
    assert gates["cancel_release_p99"].pass_.value == 2.0
    assert gates["ttft_critical_p95"].pass_.value == pytest.approx(0.9)
    assert gates["ttft_critical_p95"].filter.priority == ["critical"]
    assert gates["tenant_share_cap"].pass_.value == 0.15
    assert gates["preempted_complete"].pass_.text == "rate > 0.99"
    assert all(g.on_missing == "invalid" for g in gates.values())


@pytest.mark.parametrize(
    ("entry", "path", "words"),
    [
        (
            '  - {id: a, title: A, metric: ttft, pass: "p(95) < 1"}\n'
            '  - {id: b, title: B, metric: ttft, pass: "p95 < 1"}',
            "gates[1] (id: b).pass",
            "STAT OP NUMBER",
        ),
        (
            '  - {id: a, title: A, metric: ttft, pass: "p(95) < 1", filter: {priority: [urgent]}}',
            "gates[0] (id: a).filter.priority[0]",
            "critical",
        ),
        (
            '  - {id: a, title: A, metric: nosuch, pass: "max < 1"}',
            "gates[0] (id: a)",
            "known metrics",
        ),
        (
            '  - {id: a, title: A, metric: oom_events, pass: "count == 0", filter: {tenant: [x]}}',
            "gates[0] (id: a).filter",
            "cannot filter by tenant",
        ),
        (
            '  - {id: a, title: A, metric: ttft, pass: "p(95) < 1", params: {grace_s: 2}}',
            "gates[0] (id: a).params",
            "has no parameter grace_s; its parameters: none",
        ),
        (
            '  - {id: a, title: A, metric: ttft, pass: "p(95) < 1", colour: red}',
            "gates[0] (id: a).colour",
            "Extra",
        ),
        (
            '  - {id: a, title: A, metric: ttft, pass: "p(95) < 1", warn: "max < 1"}',
            "gates[0] (id: a)",
            "same statistic",
        ),
        (
            '  - {id: a, title: A, metric: ttft, pass: "p(95) < 1", filter: {window: lunch}}',
            "gates[0] (id: a).filter.window",
            "phase:NAME",
        ),
    ],
)
def test_bad_gate_file_names_the_yaml_path(
    tmp_path: Path, entry: str, path: str, words: str
) -> None:
    with pytest.raises(GateSpecError) as err:
        load_gate_file(gate_file(tmp_path / "g.yaml", entry))
    assert path in str(err.value)
    assert words in str(err.value)


def test_the_models_know_no_metric_and_the_loader_checks_each_gate_against_its_own() -> None:
    """As k6 checks its thresholds at init: the spec's models check a gate's shape alone (so
    the registry never needs them back), and the loader checks it against its metric."""
    retired = {"id": "r", "title": "R", "metric": "retired_metric", "pass": "max < 1"}
    assert GateSpec.model_validate(retired).metric == "retired_metric"
    served = {"id": "s", "title": "S", "metric": "availability", "pass": "p(95) > 0.9"}
    with pytest.raises(GateSpecError) as err:
        checked_gate_file({"gates": [retired, served]}, "these gates are invalid")
    assert str(err.value).splitlines() == [
        "these gates are invalid:",
        f"  gates[0] (id: r): metric 'retired_metric' is unknown; known metrics: "
        f"{', '.join(sorted(REGISTRY))}",
        "  gates[1] (id: s).pass: metric 'availability' is a rate metric and cannot be judged "
        "by p(95); use one of: rate, count, sum",
    ]


def test_the_gates_a_verdict_keeps_are_checked_against_their_metrics_when_read_back() -> None:
    kept = {"id": "ttft_critical_p95", "title": "t", "metric": "ttft", "pass": "p(95) <= 0.9"}
    judged = verdict(Status.PASS, ttft_gate(spec=kept))
    judged.fail_score_below = 0.75
    assert judged.gate_file().gates[0].pass_.value == pytest.approx(0.9)
    judged.gates[0].spec = {**kept, "metric": "retired_metric"}
    with pytest.raises(GateSpecError) as err:
        judged.gate_file()
    assert str(err.value).splitlines()[:2] == [
        "the gates the verdict of run keeps do not read back:",
        f"  gates[0] (id: ttft_critical_p95): metric 'retired_metric' is unknown; known metrics: "
        f"{', '.join(sorted(REGISTRY))}",
    ]
    assert str(err.value).endswith("judge the run again with `kvgate gate RUN_DIR --gates FILE`")


def test_duplicate_ids_and_yaml_syntax_errors(tmp_path: Path) -> None:
    entry = '  - {id: a, title: A, metric: ttft, pass: "p(95) < 1"}'
    with pytest.raises(GateSpecError, match="appears twice"):
        load_gate_file(gate_file(tmp_path / "dup.yaml", entry, entry))
    bad = tmp_path / "bad.yaml"
    bad.write_text("gates: [\n")
    with pytest.raises(GateSpecError, match="not valid YAML"):
        load_gate_file(bad)


def test_cli_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "meta.json").write_text("{}")
    bad = gate_file(tmp_path / "g.yaml", '  - {id: a, title: A, metric: ttft, pass: "p95 < 1"}')
    assert main([str(tmp_path / "run"), "--gates", str(bad)]) == 2
    assert "gates[0] (id: a).pass" in capsys.readouterr().err
