"""`kvgate compare` on failure rates, censored latencies, multiplicity and evidence: a
candidate that newly fails where the gates count failures is never promoted."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import fisher_exact

from gates.evidence import CHECKS, CheckDef, Effect, Finding
from gates.rundir import RunData, load_run
from gates.spec import BUILTIN_GATES, GateFile, load_gate_file
from reports.compare_cmd import main
from reports.decide import compare_runs
from reports.significance import BOSCHLOO_MAX_TABLES, holm, worse_rate_p
from reports.synthetic import make_run
from tests.gates.builder import RunBuilder

CLIENT_GATES = ("availability", "timeouts_disconnects", "ttft_critical_p95")


def client_gates(path: Path) -> Path:
    """The built-in gates a run of client records alone can judge, as the built-in file has
    them (so the rates compare counts are the ones the release gates count)."""
    data = yaml.safe_load(BUILTIN_GATES.read_text())
    data["gates"] = [g for g in data["gates"] if g["id"] in CLIENT_GATES]
    path.write_text(yaml.safe_dump(data))
    return path


def traffic(
    path: Path, *, critical_timeouts: int = 0, n_critical: int = 1000, n_interactive: int = 4000
) -> RunData:
    """Critical and interactive questions with the same first-token times in every run; the
    first `critical_timeouts` critical ones time out before their first token."""
    rng = np.random.default_rng(3)
    b = RunBuilder()
    for i, ttft in enumerate(rng.uniform(0.1, 0.5, n_critical)):
        t = 20 + i * 50 / n_critical
        if i < critical_timeouts:
            b.request(f"c{i}", t=t, priority="critical", outcome="timeout", http_status=None)
        else:
            b.request(f"c{i}", t=t, priority="critical", ttft_s=ttft, e2e_s=ttft + 1)
    for i, ttft in enumerate(rng.uniform(0.1, 0.5, n_interactive)):
        b.request(f"i{i}", t=20 + i * 50 / n_interactive, ttft_s=ttft, e2e_s=ttft + 1)
    return load_run(b.write(path))


def small(path: Path) -> RunData:
    return traffic(path, n_critical=200, n_interactive=400)


def test_new_critical_timeouts_are_never_promoted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """2% of critical questions newly time out with no first token. Every gate still passes
    (availability and timeouts over all traffic stay under 1%, and the critical p95 stays
    under its line), but the critical requests' censored share rose beyond the margin: the
    key gate ttft_critical_p95 bounds it, so the candidate rolls back."""
    gates = client_gates(tmp_path / "gates.yaml")
    baseline = traffic(tmp_path / "baseline")
    candidate = traffic(tmp_path / "candidate", critical_timeouts=20)
    result = compare_runs(candidate, baseline, load_gate_file(gates))
    assert {g["id"]: g["candidate"] for g in result.gates} == dict.fromkeys(CLIENT_GATES, "PASS")
    rates = {r.gate: r for r in result.rates}
    censored = rates["ttft_critical_p95"]
    assert (censored.failed_candidate, censored.n_candidate) == (20, 1000)
    assert (censored.failed_baseline, censored.n_baseline) == (0, 1000)
    assert censored.worse and censored.p_adjusted < 0.01
    # the same 20 failures over all 5000 requests stay within those gates' 1% tolerance
    assert rates["availability"].failed_candidate == 20 and not rates["availability"].worse
    assert not rates["timeouts_disconnects"].worse
    assert result.decision == "ROLLBACK"
    assert any("fails more often: ttft_critical_p95" in r for r in result.reasons)

    code = main([str(candidate.path), str(baseline.path), "--gates", str(gates)])
    assert code == 3
    decision = json.loads((candidate.path / "rollback.json").read_text())
    row = next(r for r in decision["rates"] if r["gate"] == "ttft_critical_p95")
    assert row["worse"] and row["failed_candidate"] == 20 and row["test"] == "fisher"
    assert row["p_adjusted"] >= row["p_value"]
    assert decision["multiplicity"]["method"] == "holm"
    markdown = (candidate.path / "rollback.md").read_text()
    assert "## Failure rates" in markdown
    row_text = "| ttft_critical_p95 (key) | critical, short_qa | no value, +inf | 20 of 1000"
    assert row_text in markdown
    assert "fails more often: ttft_critical_p95" in capsys.readouterr().out


def test_requests_without_a_first_token_count_in_the_rank_test(tmp_path: Path) -> None:
    """A request the server never answered is a TTFT of +inf for the rank test, as for the
    gate: a third of critical questions timing out is a large slowdown, not fewer samples."""
    gates = client_gates(tmp_path / "gates.yaml")
    baseline = traffic(tmp_path / "baseline", n_critical=150)
    candidate = traffic(tmp_path / "candidate", critical_timeouts=50, n_critical=150)
    result = compare_runs(candidate, baseline, load_gate_file(gates))
    ttft = next(t for t in result.latency if (t.metric, t.group) == ("ttft", "short_qa/critical"))
    assert (ttft.n_candidate, ttft.n_baseline) == (150, 150)
    assert ttft.large_regression  # every +inf ranks above every baseline value: effect ~ 1/3
    assert result.decision == "ROLLBACK"


def test_independent_runs_of_one_scheduler_promote(
    synthetic_runs: dict[str, Path], tmp_path: Path
) -> None:
    """Two runs of the same scheduler with different random draws: some rates and latencies
    differ by chance, none beyond what the family's error rate allows."""
    other = make_run(tmp_path / "other", 5000, 8000, seed=8)
    result = compare_runs(load_run(other), load_run(synthetic_runs["clean"]), load_gate_file())
    assert result.decision == "PROMOTE", result.reasons
    assert result.rates and not any(r.worse for r in result.rates)
    assert result.multiplicity["tests"] >= len(result.latency)


def test_identical_runs_have_nothing_to_test(synthetic_runs: dict[str, Path]) -> None:
    """A run against itself: every rate the gates bound is reported, none differs."""
    clean = synthetic_runs["clean"]
    result = compare_runs(load_run(clean), load_run(clean), load_gate_file())
    assert result.decision == "PROMOTE"
    assert {"availability", "timeouts_disconnects", "ttft_critical_p95"} <= {
        r.gate for r in result.rates
    }
    assert all(r.p_adjusted == 1.0 and r.change == 0 for r in result.rates)


def test_adjusted_p_values_are_never_below_raw_ones(synthetic_runs: dict[str, Path]) -> None:
    result = compare_runs(
        load_run(synthetic_runs["oom"]), load_run(synthetic_runs["clean"]), load_gate_file()
    )
    pairs = [(t.p_value, t.p_adjusted) for t in result.latency] + [
        (r.p_value, r.p_adjusted) for r in result.rates
    ]
    assert pairs and all(p <= adjusted <= 1.0 for p, adjusted in pairs)
    assert result.multiplicity["tests"] == len(result.latency) + sum(
        r.in_family for r in result.rates
    )


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=40))
def test_holm_keeps_order_and_never_lowers_a_p_value(p_values: list[float]) -> None:
    adjusted = holm(p_values)
    assert all(p <= a <= 1.0 for p, a in zip(p_values, adjusted, strict=True))
    for i, j in zip(range(len(p_values)), range(1, len(p_values)), strict=False):
        if p_values[i] <= p_values[j]:
            assert adjusted[i] <= adjusted[j]
    assert min(adjusted) == pytest.approx(min(1.0, len(p_values) * min(p_values)))


def test_holm_steps_down() -> None:
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, math.nan]) == [1.0, 1.0]


def test_the_exact_test_is_one_sided_and_boschloo_where_affordable() -> None:
    p, test = worse_rate_p(8, 100, 0, 100)
    assert test == "boschloo" and p < 0.01
    fisher = float(fisher_exact(np.array([[8, 0], [92, 100]]), alternative="greater").pvalue)
    assert p <= fisher  # Boschloo is uniformly more powerful than Fisher
    assert worse_rate_p(0, 100, 8, 100)[0] > 0.99  # the candidate is better: no evidence
    n = math.isqrt(BOSCHLOO_MAX_TABLES) + 1
    assert worse_rate_p(8, n, 0, n)[1] == "fisher"
    assert worse_rate_p(0, 100, 0, 100) == (1.0, "none")
    with pytest.raises(ValueError, match="5 failures of 3 requests"):
        worse_rate_p(5, 3, 0, 10)


@pytest.fixture
def distrust_plan(monkeypatch: pytest.MonkeyPatch) -> str:
    """An evidence check that distrusts every run whose plan is named as returned."""
    name = "distrusted-plan"

    def check(run: RunData) -> list[Finding]:
        if (run.meta.get("plan") or {}).get("name") != name:
            return []
        return [Finding("test_distrust", Effect.INVALID, "the run stopped halfway")]

    monkeypatch.setitem(
        CHECKS, "test_distrust", CheckDef("test_distrust", check, 500, "distrusts one plan")
    )
    return name


def test_evidence_problems_are_reasons_not_to_promote(tmp_path: Path, distrust_plan: str) -> None:
    """The candidate's or the baseline's: a run its evidence checks distrust proves nothing
    about the other, and the comparison says which finding stands in the way."""
    gates = load_gate_file(client_gates(tmp_path / "gates.yaml"))
    assert compare_runs(small(tmp_path / "c"), small(tmp_path / "b"), gates).decision == "PROMOTE"
    for side in ("candidate", "baseline"):
        runs = {s: small(tmp_path / f"{side}-{s}") for s in ("candidate", "baseline")}
        runs[side].meta["plan"] = {"name": distrust_plan}
        result = compare_runs(runs["candidate"], runs["baseline"], gates)
        assert result.decision == "HOLD"
        assert (
            f"the evidence checks distrust the {side} run: test_distrust: the run stopped halfway"
            in result.reasons
        )
        assert getattr(result, side)["evidence"]["problems"] == [
            "test_distrust: the run stopped halfway"
        ]


def test_a_run_the_evidence_checks_refuse_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(run: RunData) -> list[Finding]:
        return [Finding("test_refuse", Effect.REFUSE, "priority 'urgent' is not defined")]

    baseline = small(tmp_path / "baseline").path
    monkeypatch.setitem(CHECKS, "test_refuse", CheckDef("test_refuse", refuse, 1, "refuses all"))
    assert main([str(baseline), str(baseline)]) == 2
    err = capsys.readouterr().err
    assert f"the candidate run {baseline}" in err and "priority 'urgent'" in err


def test_gate_file_rates_use_the_gates_margins(tmp_path: Path) -> None:
    """The margin of a rate is its gate's own tolerance: 1 - 0.99 for availability, the
    timeouts gate's 1%, the censored latency's 1%."""
    gates: GateFile = load_gate_file(client_gates(tmp_path / "gates.yaml"))
    run = small(tmp_path / "run")
    margins = {r.gate: r.margin for r in compare_runs(run, run, gates).rates}
    assert margins == pytest.approx(
        {"availability": 0.01, "timeouts_disconnects": 0.01, "ttft_critical_p95": 0.01}
    )
